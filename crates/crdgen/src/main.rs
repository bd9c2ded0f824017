//! `crdgen`: write or check `crds/*.yaml`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

/// Generate the kube-on-kube CustomResourceDefinitions from the Rust API types.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Directory the CRD files are written to (one file per kind).
    #[arg(long, env = "KOK_CRD_DIR", default_value = "crds")]
    out: PathBuf,
    /// Do not write; exit with status 1 and list the files that differ from
    /// what the types generate.
    #[arg(long)]
    check: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.check {
        let stale = crdgen::stale(&args.out)?;
        if stale.is_empty() {
            println!("{} is up to date", args.out.display());
            return Ok(());
        }
        eprintln!(
            "out of date (run `cargo run -p crdgen`): {}",
            stale.join(", ")
        );
        std::process::exit(1);
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    for (file, text) in crdgen::render()? {
        let path = args.out.join(file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
