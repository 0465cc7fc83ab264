//! Command-line arguments and entry points of `simulate` and `diff`.
//!
//! Entry points return a [`CliError`], whose [`CliError::exit_code`] is 2 for
//! bad input, 1 when a `--fail-on` condition holds or output cannot be
//! written.

use std::io::Write;
use std::path::PathBuf;

use clap::ValueEnum;

use crate::manifest;
use crate::policy::World;

use super::chart::ChartError;
use super::diff::{self, DiffError, FailOn};
use super::engine::{SimError, Strategy};
use super::{chart, report};
use crate::scenario;
use crate::scenario::ScenarioError;

/// The policy a simulation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    /// The gateway enforces the latest decision of the engine.
    Lanekeeper,
    /// One shared FIFO queue, no priorities, no shedding.
    Fifo,
    /// Fixed per-lane rate limits at the contract floors, no ladder.
    Static,
    /// Equal weighted shares of the pool (APF-style fair queuing), no ladder.
    Fair,
}

impl From<StrategyArg> for Strategy {
    fn from(p: StrategyArg) -> Self {
        match p {
            StrategyArg::Lanekeeper => Strategy::Lanekeeper,
            StrategyArg::Fifo => Strategy::Fifo,
            StrategyArg::Static => Strategy::Static,
            StrategyArg::Fair => Strategy::Fair,
        }
    }
}

/// Output formats of `simulate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SimOutput {
    /// A table for a human.
    Table,
    /// The whole report as JSON.
    Json,
    /// Markdown (for a pull-request comment).
    Markdown,
}

/// `lanekeeper simulate`.
#[derive(Clone, Debug, clap::Args)]
pub struct SimulateArgs {
    /// Manifest files or directories (as for `plan`).
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// The scenario (YAML; see docs/simulate.md).
    #[arg(long)]
    pub scenario: PathBuf,
    /// Which gateway runs: lanekeeper or a baseline.
    #[arg(long, value_enum, default_value = "lanekeeper")]
    pub policy: StrategyArg,
    /// Override the scenario's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: SimOutput,
    /// Also write an SVG chart (capacity, demand, admitted per lane, level).
    #[arg(long, value_name = "OUT.svg")]
    pub chart: Option<PathBuf>,
}

/// Output formats of `diff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffOutput {
    /// Plain text.
    Table,
    /// Markdown (for a pull-request comment).
    Markdown,
    /// JSON.
    Json,
}

/// `lanekeeper diff`.
#[derive(Clone, Debug, clap::Args)]
pub struct DiffArgs {
    /// Manifests before the change (file or directory).
    #[arg(long, required = true, num_args = 1..)]
    pub base: Vec<PathBuf>,
    /// Manifests after the change (file or directory).
    #[arg(long, required = true, num_args = 1..)]
    pub head: Vec<PathBuf>,
    /// Scenarios to simulate under both (repeatable).
    #[arg(long, num_args = 1..)]
    pub scenario: Vec<PathBuf>,
    /// Signal timelines to plan under both (repeatable).
    #[arg(long, num_args = 1..)]
    pub signals: Vec<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: DiffOutput,
    /// Exit 1 when any of these holds (comma-separated): p0-deadline-regression,
    /// deadline-regression, new-warnings, decision-change, more-transitions.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub fail_on: Vec<FailOn>,
}

/// Why `simulate` or `diff` failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The manifests could not be loaded.
    #[error(transparent)]
    Manifests(#[from] manifest::LoadError),
    /// `simulate` found no CapacityProfile.
    #[error("no CapacityProfile found in the manifests: nothing to simulate")]
    NoProfiles,
    /// The scenario could not be loaded.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// The scenario does not run against the manifests.
    #[error("{}: {source}", .path.display())]
    Simulate {
        /// The scenario file.
        path: PathBuf,
        /// Why.
        #[source]
        source: SimError,
    },
    /// `diff` was given nothing to run.
    #[error("give at least one --scenario or --signals")]
    NothingToDiff,
    /// The diff could not be computed.
    #[error(transparent)]
    Diff(#[from] DiffError),
    /// The JSON output could not be produced.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The chart could not be drawn or written.
    #[error(transparent)]
    Chart(#[from] ChartError),
    /// The output could not be written (a closed pipe among the causes).
    #[error("writing to stdout: {0}")]
    Stdout(#[source] std::io::Error),
    /// `--fail-on` conditions hold, each with its evidence.
    #[error("--fail-on: {}", .failures.join("; "))]
    FailOn {
        /// The conditions that hold, as [`diff::gate`] words them.
        failures: Vec<String>,
    },
}

impl CliError {
    /// The process exit code: 2 for bad input, 1 for a `--fail-on` condition
    /// or output that could not be produced.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Manifests(_)
            | CliError::NoProfiles
            | CliError::Scenario(_)
            | CliError::Simulate { .. }
            | CliError::NothingToDiff
            | CliError::Diff(_) => 2,
            CliError::Json(_)
            | CliError::Chart(_)
            | CliError::Stdout(_)
            | CliError::FailOn { .. } => 1,
        }
    }
}

/// Loads manifests, printing notes to stderr.
pub fn load_world(files: &[PathBuf]) -> Result<World, CliError> {
    let loaded = manifest::load(files)?;
    for n in &loaded.notes {
        eprintln!("note: {n}");
    }
    Ok(loaded.world)
}

/// Writes the output; a failed write is an error, not a panic.
fn write_out(out: &mut dyn Write, text: &str) -> Result<(), CliError> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(CliError::Stdout)
}

/// Runs `lanekeeper simulate`, writing the report to `out`.
pub fn run_simulate(args: &SimulateArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let world = load_world(&args.files)?;
    if world.profiles.is_empty() {
        return Err(CliError::NoProfiles);
    }
    let mut sc = scenario::load(&args.scenario)?;
    if let Some(s) = args.seed {
        sc.seed = s;
    }
    let (_, rep) =
        super::simulate(&world, &sc, args.policy.into()).map_err(|source| CliError::Simulate {
            path: args.scenario.clone(),
            source,
        })?;
    let text = match args.output {
        SimOutput::Table => report::render_table(&rep),
        SimOutput::Markdown => report::render_markdown(&rep),
        SimOutput::Json => format!("{}\n", serde_json::to_string_pretty(&rep)?),
    };
    write_out(out, &text)?;
    if let Some(path) = &args.chart {
        chart::write_svg(&rep, path)?;
        eprintln!("note: chart written to {}", path.display());
    }
    Ok(())
}

/// Runs `lanekeeper diff`, writing the comparison to `out`.
pub fn run_diff(args: &DiffArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if args.scenario.is_empty() && args.signals.is_empty() {
        return Err(CliError::NothingToDiff);
    }
    let base = load_world(&args.base)?;
    let head = load_world(&args.head)?;
    let d = diff::diff(&base, &head, &args.scenario, &args.signals)?;
    let d = diff::Labelled {
        base: args
            .base
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        head: args
            .head
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        diff: d,
    };
    let failures = diff::gate(&d.diff, &args.fail_on);
    let text = match args.output {
        DiffOutput::Table => diff::render_text(&d, &failures),
        DiffOutput::Markdown => diff::render_markdown(&d, &failures),
        DiffOutput::Json => format!("{}\n", serde_json::to_string_pretty(&d)?),
    };
    write_out(out, &text)?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(CliError::FailOn { failures })
    }
}
