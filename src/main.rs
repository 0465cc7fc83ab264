#![forbid(unsafe_code)]
//! The `lanekeeper` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use lanekeeper::manifest;
use lanekeeper::plan;
use lanekeeper::policy::Approvals;
use lanekeeper::snapshot::SignalsFile;

/// lanekeeper: traffic lanes, capacity profiles and degradation ladders for
/// shared GPU inference pools.
#[derive(Parser)]
#[command(name = "lanekeeper", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the three CustomResourceDefinitions as YAML (or write one file
    /// per CRD with --out-dir).
    Crdgen {
        /// Write `<crd-name>.yaml` files into this directory instead of
        /// printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Evaluate manifests offline against a signal timeline and print the
    /// decisions (no cluster needed).
    Plan(PlanArgs),
    /// Simulate traffic through a gateway enforcing the engine's decisions
    /// (or a baseline) and report per-lane outcomes.
    Simulate(lanekeeper::sim::cli::SimulateArgs),
    /// Compare base and head manifests on the same scenarios and signals.
    Diff(lanekeeper::sim::cli::DiffArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(clap::Args)]
struct PlanArgs {
    /// Manifest files or directories (multi-document YAML; other kinds and
    /// non-Kubernetes documents are skipped with a note).
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// A signals timeline (YAML). Without it: one step at 0 with every
    /// profile at its safe capacity and every lane at its expected rate.
    #[arg(long)]
    signals: Option<PathBuf>,
    /// Grant approval: NAMESPACE/PROFILE=LEVEL (repeatable).
    #[arg(long = "approve", value_name = "NAMESPACE/PROFILE=LEVEL")]
    approve: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
}

fn parse_approvals(items: &[String]) -> Result<Approvals, String> {
    let mut out = Approvals::new();
    for item in items {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("--approve {item:?}: expected NAMESPACE/PROFILE=LEVEL"))?;
        if !k.contains('/') {
            return Err(format!("--approve {item:?}: expected NAMESPACE/PROFILE=LEVEL"));
        }
        let level: u32 = v.parse().map_err(|_| format!("--approve {item:?}: LEVEL must be a number"))?;
        out.insert(k.to_owned(), level);
    }
    Ok(out)
}

fn run_plan(args: &PlanArgs) -> Result<(), (u8, String)> {
    let loaded = manifest::load(&args.files).map_err(|e| (2, e.to_string()))?;
    for n in &loaded.notes {
        eprintln!("note: {n}");
    }
    let approvals = parse_approvals(&args.approve).map_err(|e| (2, e))?;
    let timeline = match &args.signals {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| (2, format!("{}: {e}", path.display())))?;
            let de = serde_yaml::Deserializer::from_str(&text);
            let t: SignalsFile = serde_path_to_error::deserialize(de)
                .map_err(|e| (2, format!("{}: {}: {}", path.display(), e.path(), e.inner())))?;
            plan::check_timeline(&t).map_err(|e| (2, format!("{}: {e}", path.display())))?;
            t
        }
        None => plan::default_timeline(&loaded.world),
    };
    if loaded.world.profiles.is_empty() {
        eprintln!("note: no CapacityProfile found: nothing to evaluate");
    }
    let p = plan::plan(&loaded.world, &timeline, &approvals);
    match args.output {
        Output::Table => print!("{}", plan::render_table(&p)),
        Output::Json => println!("{}", serde_json::to_string_pretty(&p).map_err(|e| (1, e.to_string()))?),
    }
    Ok(())
}

fn crdgen(out_dir: Option<&std::path::Path>) -> Result<(), (u8, String)> {
    match out_dir {
        None => {
            print!("{}", lanekeeper::api::crds_yaml());
            Ok(())
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| (1, format!("{}: {e}", dir.display())))?;
            for (name, yaml) in lanekeeper::api::crd_files() {
                let path = dir.join(name);
                std::fs::write(&path, yaml).map_err(|e| (1, format!("{}: {e}", path.display())))?;
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crdgen { out_dir } => crdgen(out_dir.as_deref()),
        Command::Plan(args) => run_plan(&args),
        Command::Simulate(args) => lanekeeper::sim::cli::run_simulate(&args),
        Command::Diff(args) => lanekeeper::sim::cli::run_diff(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}
