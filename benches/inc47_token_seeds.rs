//! INC-47 priced by tokens against fixed costs over many seeds: the figures
//! of docs/simulate.md, "INC-47 with tokens as the cost", beyond the one
//! seed the golden pins. Not a timed benchmark: `simulate` is
//! deterministic, so each seed's outcome is exact; what this shows is how
//! far the two runs differ from one seed to the next.
//!
//! ```sh
//! cargo bench --bench inc47_token_seeds            # seeds 1 to 30 and 47
//! LANEKEEPER_SEEDS=1,2,3 cargo bench --bench inc47_token_seeds
//! ```
//!
//! For each seed it runs `examples/inc-47-tokens/scenario.yaml` under the
//! priced manifests (`examples/inc-47-tokens`) and under INC-47's own
//! (every request costs `workUnitsPerRequest`), both through the gateway's
//! core, and prints each lane's share within deadline and its lost requests
//! under both, then per lane the mean and standard deviation of the
//! difference (priced − fixed) and in how many seeds priced was as good or
//! better.

use std::path::{Path, PathBuf};

use lanekeeper::policy::World;
use lanekeeper::scenario::Scenario;
use lanekeeper::sim::report::SimReport;
use lanekeeper::sim::{self, Strategy};

const PRICED: &str = "examples/inc-47-tokens/inc-47-tokens.yaml";
const FIXED: &str = "examples/inc-47/inc-47.yaml";
const SCENARIO: &str = "examples/inc-47-tokens/scenario.yaml";

/// One lane's outcome in one run: (name, within deadline %, lost).
type Outcome = (String, f64, u64);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn world(path: &str) -> World {
    lanekeeper::manifest::load(&[root().join(path)])
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .world
}

fn outcomes(w: &World, sc: &Scenario) -> Vec<Outcome> {
    let report: SimReport = sim::simulate(w, sc, Strategy::Lanekeeper)
        .expect("the example simulates")
        .1;
    report.profiles[0]
        .lanes
        .iter()
        .map(|l| {
            let within = l.within_deadline_percent.unwrap_or(f64::NAN);
            (l.name.clone(), within, l.lost)
        })
        .collect()
}

fn seeds() -> Vec<u64> {
    match std::env::var("LANEKEEPER_SEEDS") {
        Ok(s) => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .expect("LANEKEEPER_SEEDS: seeds separated by commas")
            })
            .collect(),
        Err(_) => (1..=30).chain([47]).collect(),
    }
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

fn main() {
    let (priced, fixed) = (world(PRICED), world(FIXED));
    let base = lanekeeper::scenario::load(Path::new(&root().join(SCENARIO)))
        .expect("the example scenario loads");
    println!("| seed | lane | fixed: within deadline | lost | priced: within deadline | lost |");
    println!("|---|---|---|---|---|---|");
    let mut diffs: Vec<(String, Vec<f64>)> = Vec::new();
    for seed in seeds() {
        let mut sc = base.clone();
        sc.seed = seed;
        let (f, p) = (outcomes(&fixed, &sc), outcomes(&priced, &sc));
        for (i, ((name, fw, fl), (_, pw, pl))) in f.iter().zip(&p).enumerate() {
            println!("| {seed} | {name} | {fw:.3} % | {fl} | {pw:.3} % | {pl} |");
            if diffs.len() <= i {
                diffs.push((name.clone(), Vec::new()));
            }
            diffs[i].1.push(pw - fw);
        }
    }
    println!();
    println!(
        "| lane | priced − fixed, within deadline: mean | sd | seeds priced as good or better |"
    );
    println!("|---|---|---|---|");
    for (name, d) in &diffs {
        let (mean, sd) = mean_sd(d);
        let good = d.iter().filter(|x| **x >= -5e-4).count();
        println!(
            "| {name} | {mean:+.4} points | {sd:.4} | {good} of {} |",
            d.len()
        );
    }
}
