//! The accalloc command-line tool: `info`, `replay`, `tune`, `compare`, `convert`, `bench`.

mod args;
mod backends;
mod environment;
mod help;
mod input;
mod replay_cmd;
mod tools;

use accalloc::runtime::runtime;
use accalloc::units::format_size;
use args::Args;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Output piped into `head` and closed: end quietly, as other command-line tools do, instead of
    // panicking on the failed print (Rust ignores SIGPIPE by default).
    // SAFETY: restoring the default disposition of one signal before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = args.first().map(String::as_str) else {
        return fail(format!("no command given\n{}", help::usage()));
    };
    let rest = &args[1..];
    // Help and the version need nothing, whatever the environment holds.
    match command {
        "-h" | "--help" => return print(&help::usage()),
        "help" => {
            return match rest {
                [] => print(&help::usage()),
                [name] => match help::command_usage(name) {
                    Some(text) => print(&text),
                    None => fail(format!("unknown command '{name}'\n{}", help::usage())),
                },
                _ => fail(format!("help takes one command\n{}", help::usage())),
            }
        }
        "-V" | "--version" | "version" => return print(&version_line()),
        _ if !help::is_command(command) => {
            return fail(format!("unknown command '{command}'\n{}", help::usage()))
        }
        _ if rest.iter().any(|a| a == "-h" || a == "--help") => {
            return print(&help::command_usage(command).expect("a command"))
        }
        _ => {}
    }
    // Every variable the library and the tool read, checked once for every command.
    let findings = environment::check(command);
    for note in &findings.notes {
        eprintln!("accalloc: {note}");
    }
    if !findings.errors.is_empty() {
        return fail(findings.errors.join("\naccalloc: "));
    }
    let result = match command {
        "info" => no_arguments(command, rest).and_then(|()| info()),
        "replay" => replay_cmd::replay_command(rest),
        "tune" => tools::tune_command(rest),
        "compare" => tools::compare_command(rest),
        "convert" => tools::convert_command(rest),
        _ => bench(rest),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(with_usage_if_about_arguments(command, message)),
    }
}

fn print(text: &str) -> ExitCode {
    println!("{text}");
    ExitCode::SUCCESS
}

fn fail(message: String) -> ExitCode {
    eprintln!("accalloc: {message}");
    ExitCode::FAILURE
}

/// Mistakes in the arguments get the command's usage after them; errors in a file or a run do not.
fn with_usage_if_about_arguments(command: &str, message: String) -> String {
    let about_arguments = message.starts_with("unknown option")
        || message.contains("needs a")
        || message.contains("takes one file")
        || message.contains("takes no");
    match help::command_usage(command) {
        Some(usage) if about_arguments => format!("{message}\n{usage}"),
        _ => message,
    }
}

fn no_arguments(command: &str, args: &[String]) -> Result<(), String> {
    let args = Args::parse(args, &[], &[])?;
    match args.positional.first() {
        Some(extra) => Err(format!("{command} takes no arguments (got '{extra}')")),
        None => Ok(()),
    }
}

fn info() -> Result<(), String> {
    let runtime = runtime().map_err(|e| e.message)?;
    let accelerator = runtime.current();
    println!("accelerator: {}", accelerator.name());
    if let Some(why) = runtime.cuda_absent_because() {
        println!("cuda: not in use ({why})");
    }
    println!("devices: {}", accelerator.device_count());
    for device in 0..accelerator.device_count() {
        let info = accelerator
            .mem_get_info(device as i32)
            .map_err(|e| e.message)?;
        println!(
            "device {device}: capacity {} ({} bytes), free {}",
            format_size(info.total as u64),
            info.total,
            format_size(info.free as u64)
        );
    }
    println!("{}", version_line());
    Ok(())
}

fn version_line() -> String {
    format!(
        "accalloc {} (ABI {})",
        env!("CARGO_PKG_VERSION"),
        accalloc::capi::ACCALLOC_ABI_VERSION
    )
}

fn bench(args: &[String]) -> Result<(), String> {
    let parsed = Args::parse(args, &["--quick"], &[])?;
    if let Some(extra) = parsed.positional.first() {
        return Err(format!(
            "bench takes no arguments but --quick (got '{extra}')"
        ));
    }
    let quick = parsed.has("--quick");
    let (batches, pairs) = if quick { (11, 2_000) } else { (101, 20_000) };
    runtime().map_err(|e| e.message)?;
    let rows = accalloc_tools::replay::bench::run(batches, pairs);
    println!("median of {batches} batches of {pairs} malloc+free pairs, host backend, one thread");
    print!("{}", accalloc_tools::replay::bench::table(&rows));
    // Last of the one-thread rows: putting other devices in use gives the one-device shortcut up.
    if let Some((shortcut, general)) = accalloc_tools::replay::bench::general_path(batches, pairs) {
        println!("\nthe mixed pairs on device 0: the one-device shortcut against the general path (the shortcut suspended), in turns");
        println!("| path | accalloc malloc+free (ns) | / the shortcut |\n|---|---:|---:|");
        println!("| one device in use (the shortcut) | {shortcut:.1} | 1.00 |");
        println!(
            "| general path, same device | {general:.1} | {:.2} |",
            general / shortcut
        );
        for (devices, ns) in accalloc_tools::replay::bench::several_devices(batches, pairs) {
            println!(
                "| {devices} devices in use (several devices in use) | {ns:.1} | {:.2} |",
                ns / shortcut
            );
        }
    }

    // Several threads: one device (one lock) against one device each (ACCALLOC_HOST_DEVICES permitting).
    let devices = runtime().map_err(|e| e.message)?.current().device_count();
    // Long enough (a million pairs a thread by default) for the scheduler to have spread the threads.
    let threaded_pairs = pairs * 50;
    println!("\nthreads, wall-clock ns per pair (mixed sizes, {threaded_pairs} pairs a thread, best of 3; {} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("| threads | same device | one device each |\n|---:|---:|---:|");
    for threads in [1usize, 2, 4] {
        let same = accalloc_tools::replay::bench::threaded(threads, threaded_pairs, |_| 0);
        let separate = if devices >= threads {
            format!(
                "{:.1}",
                accalloc_tools::replay::bench::threaded(threads, threaded_pairs, |t| t as i32)
            )
        } else {
            format!("(needs ACCALLOC_HOST_DEVICES={threads})")
        };
        println!("| {threads} | {same:.1} | {separate} |");
    }

    // Planned placement: a step's requests at their planned addresses, against the cache.
    let (batches_of_steps, steps) = if quick { (11, 20) } else { (101, 100) };
    let planned = accalloc_tools::replay::plan_bench::run(batches_of_steps, steps);
    println!(
        "\nplanned_placement: a training step's {} requests, repeated, on a simulated device \
         (median of {batches_of_steps} batches of {steps} steps; {} of the last step's served at \
         planned addresses)",
        planned.per_step, planned.advised_last_step
    );
    println!("| requests | ns per request (malloc and its free) | / cached |\n|---|---:|---:|");
    println!(
        "| cached (default policy) | {:.1} | 1.00 |",
        planned.cached_ns
    );
    println!(
        "| planned (planned_placement:True, plan in force) | {:.1} | {:.2} |",
        planned.planned_ns,
        planned.ratio()
    );

    // Making a plan: a large step's placement, the orders one after the other against on threads.
    let rounds = if quick { 3 } else { 9 };
    let planning = accalloc_tools::replay::plan_bench::planning(rounds);
    println!(
        "\nplanned_placement: making the plan of a step of {} allocations (every order of the \
         greedy placement; median of {rounds}; {} cores; the same placement both ways: {})",
        planning.blocks, planning.cores, planning.same_placement
    );
    println!("| orders placed | ms per plan | / one thread |\n|---|---:|---:|");
    println!(
        "| one after the other | {:.1} | 1.00 |",
        planning.one_thread_ms
    );
    println!(
        "| on threads of their own (the planner's way) | {:.1} | {:.2} |",
        planning.threaded_ms,
        planning.ratio()
    );

    // The longest request: a large step's plan made in the request that found the step, against
    // off the request path.
    let stall = accalloc_tools::replay::plan_bench::stall(300);
    println!(
        "\nplanned_placement: the longest request of four steps of {} allocations in which the \
         step's plan is found and made ({:.0} ms a step away from the allocator, as on a device; a \
         plan in force at the end both ways: {})",
        stall.allocations_per_step, stall.step_ms, stall.planned_both_ways
    );
    println!("| plan made | longest request, ms | / at once |\n|---|---:|---:|");
    println!(
        "| at once, in the request that found the step | {:.1} | 1.00 |",
        stall.at_once_ms
    );
    println!(
        "| off the request path, in force one step later (the planner's way) | {:.1} | {:.3} |",
        stall.off_path_ms,
        stall.off_path_ms / stall.at_once_ms
    );

    // Sleep and wake: a pool's pages paused and resumed, against a plain copy of the same bytes.
    let (bytes, rounds) = if quick { (256 << 20, 3) } else { (1 << 30, 7) };
    let rows = accalloc_tools::replay::sleep_bench::run(bytes, rounds)?;
    println!(
        "\nsleep and wake of a {} MiB pool on host device 0, median of {rounds} rounds, ms per GiB",
        bytes >> 20
    );
    print!("{}", accalloc_tools::replay::sleep_bench::table(&rows));
    Ok(())
}
