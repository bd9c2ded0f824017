//! The committed `crds/` must be exactly what the types generate.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let stale = crdgen::stale(&dir).expect("render CRDs");
    assert!(
        stale.is_empty(),
        "crds/ is out of date, run `cargo run -p crdgen`: {stale:?}"
    );
}
