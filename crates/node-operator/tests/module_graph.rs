//! The node-operator's modules form a graph without cycles: a controller
//! imports its steps and the leaves below them (context, ssh, install…),
//! never the reverse (docs/architecture.md).

#[test]
fn the_module_graph_has_no_cycle() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    kok_testenv::modules::assert_no_cycles(&src, &["controller", "machine"]);
}
