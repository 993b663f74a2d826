//! A small command-line parser: positional arguments, switches, and options with one value each.

use std::collections::HashMap;

/// The arguments of one command.
pub struct Args {
    pub positional: Vec<String>,
    switches: Vec<String>,
    /// Every value of each option, in order (--config may come twice).
    values: HashMap<String, Vec<String>>,
}

impl Args {
    /// Split `args`: `switches` take no value, `options` one; anything else starting with "-" (but
    /// "-" itself) is an error, as is an option without its value.
    pub fn parse(args: &[String], switches: &[&str], options: &[&str]) -> Result<Args, String> {
        let mut parsed = Args {
            positional: Vec::new(),
            switches: Vec::new(),
            values: HashMap::new(),
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            if switches.contains(&arg.as_str()) {
                parsed.switches.push(arg.clone());
            } else if options.contains(&arg.as_str()) {
                let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
                parsed
                    .values
                    .entry(arg.clone())
                    .or_default()
                    .push(value.clone());
            } else if arg.starts_with('-') && arg.len() > 1 {
                return Err(format!("unknown option {arg}"));
            } else {
                parsed.positional.push(arg.clone());
            }
        }
        Ok(parsed)
    }

    pub fn has(&self, switch: &str) -> bool {
        self.switches.iter().any(|s| s == switch)
    }

    /// The last value of an option.
    pub fn value(&self, option: &str) -> Option<&str> {
        self.values
            .get(option)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    pub fn all(&self, option: &str) -> &[String] {
        self.values.get(option).map_or(&[], Vec::as_slice)
    }

    /// The single positional argument (the input file), or an error naming what is missing.
    pub fn one_file(&self, command: &str) -> Result<&str, String> {
        match self.positional.as_slice() {
            [file] => Ok(file),
            [] => Err(format!("{command} needs a trace or snapshot file")),
            _ => Err(format!("{command} takes one file at a time")),
        }
    }

    /// A capacity option, a size under accalloc::units' rule ("80GiB", "81920MiB",
    /// "85899345920"; GB and the like refused as ambiguous). A bare number under 1 MiB is refused
    /// too: a device of 80 bytes is a forgotten unit, not a device (80B says bytes are meant).
    pub fn capacity(&self, option: &str) -> Result<Option<usize>, String> {
        let Some(text) = self.value(option) else {
            return Ok(None);
        };
        let size = accalloc::units::parse_size(text).map_err(|why| format!("{option}: {why}"))?;
        let text = text.trim();
        if size.bytes == 0 {
            return Err(format!(
                "{option}: '{text}' is no memory at all: give the device's memory, e.g. 80GiB"
            ));
        }
        if !size.unit_given && size.bytes < 1 << 20 {
            return Err(format!(
                "{option}: '{text}' would be {text} bytes (a bare number is bytes), surely not the \
                 device's memory: write the unit (e.g. 80GiB), or {text}B if bytes are meant"
            ));
        }
        usize::try_from(size.bytes)
            .map(Some)
            .map_err(|_| format!("{option}: '{text}' is more than this machine can address"))
    }
}
