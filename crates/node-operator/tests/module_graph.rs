//! The node-operator's modules form a graph without cycles, file by file: a
//! controller imports its steps and the leaves below them (context, ssh,
//! install…), never the reverse; the controller is wired by the crate's
//! roots alone (docs/architecture.md).

use std::path::PathBuf;

use kok_testenv::modules;

fn src() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_module_graph_has_no_cycle() {
    modules::assert_no_cycles(&src(), &["controller", "machine"]);
}

#[test]
fn the_controller_is_wired_by_the_roots_alone() {
    modules::assert_imported_only_by(&src(), "controller", &[]);
}
