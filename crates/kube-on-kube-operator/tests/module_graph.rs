//! The operator's modules form a graph without cycles: a step imports the
//! leaves below it (config, names, versions, render…), never the driver
//! that calls it or a step that imports it (docs/architecture.md).

#[test]
fn the_module_graph_has_no_cycle() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    kok_testenv::modules::assert_no_cycles(&src, &["controller", "render"]);
}
