//! The operator's modules form a graph without cycles: a step imports the
//! leaves below it (config, names, versions, render…), never the driver
//! that calls it or a step that imports it (docs/architecture.md).

use std::path::Path;

use kok_testenv::modules;

#[test]
fn the_module_graph_has_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = modules::graph(&src).expect("read the sources");
    assert!(graph.contains_key("controller") && graph.contains_key("render"));
    let cycles = modules::cycles(&graph);
    assert!(
        cycles.is_empty(),
        "modules that import each other: {}",
        modules::describe(&graph, &cycles)
    );
}
