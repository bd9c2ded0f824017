//! The operator's modules form a graph without cycles, file by file: a
//! step imports the leaves below it (config, names, versions, render…),
//! never the driver that calls it or a step that imports it; rendering is
//! pure (it reads the spec and the operator's settings, never the API);
//! and only the watches wire the driver (docs/architecture.md).

use std::path::PathBuf;

use kok_testenv::modules;

fn src() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_module_graph_has_no_cycle() {
    modules::assert_no_cycles(&src(), &["controller", "render", "etcd", "backup"]);
}

#[test]
fn rendering_refers_only_to_the_spec_and_settings() {
    modules::assert_imports_only(
        &src(),
        "render",
        &["names", "config", "versions", "network", "bounded", "error"],
    );
}

#[test]
fn only_the_watches_refer_to_the_driver() {
    modules::assert_imported_only_by(&src(), "controller", &["watches"]);
}
