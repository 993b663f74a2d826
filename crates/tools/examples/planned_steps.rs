//! The planned-request benchmark's step alone, planned or from the cache, for a profiler or an
//! instruction counter (`accalloc bench` times the two in turns; this runs one):
//!
//! ```sh
//! cargo build --release -p accalloc-tools --example planned_steps
//! valgrind --tool=callgrind target/release/examples/planned_steps planned 3000
//! ```
//!
//! The step has 108 allocations; the instructions of 6,000 steps less those of 3,000, over 324,000,
//! are a request's (its malloc and its free) once the plan is made and the cache filled.

use accalloc_tools::replay::plan_bench::steps_alone;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, steps) = match args.as_slice() {
        [_, mode, steps] if mode == "planned" || mode == "cached" => (mode.as_str(), steps.parse()),
        _ => {
            eprintln!("usage: planned_steps planned|cached STEPS");
            std::process::exit(2);
        }
    };
    let Ok(steps) = steps else {
        eprintln!("STEPS must be a whole number");
        std::process::exit(2);
    };
    let ns = steps_alone(mode == "planned", steps);
    println!("{mode}: {ns:.1} ns per request over {steps} steps");
}
