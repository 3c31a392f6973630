//! Loads the configuration (`FERROCX_CONFIG`, or the file given as the first argument), finds
//! every adaptor (built-in and plugins), and prints what each cluster would use.
//!
//! ```text
//! cargo run -p ferrocx-cli --example select -- configs/local.toml
//! ```

use std::path::PathBuf;

use ferrocx::config::Config;
use ferrocx::registry::Registry;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lookup = |k: &str| std::env::var(k).ok();
    let (config, warnings) = match std::env::args_os().nth(1).map(PathBuf::from) {
        Some(path) => {
            let mut c = Config::load(&path)?;
            let w = c.apply_env(lookup)?;
            (c, w)
        }
        None => Config::from_env(lookup)?,
    };
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let registry = Registry::discover(&config.runtime);
    for refused in registry.rejected() {
        eprintln!("refused: {refused}");
    }
    for (i, cluster) in config.clusters.iter().enumerate() {
        match registry.select(&config, i) {
            Ok(sel) => {
                let props = sel.device.properties(0).map(|p| p.name).unwrap_or_default();
                println!(
                    "{} (ranks {}): device {} {props:?}, ccl {}",
                    cluster.name,
                    cluster.ranks,
                    sel.device.name(),
                    sel.ccl.name()
                );
            }
            Err(e) => println!("{} (ranks {}): {e}", cluster.name, cluster.ranks),
        }
    }
    Ok(())
}
