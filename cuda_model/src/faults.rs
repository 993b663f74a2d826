//! Injected failures: `ENTRY:after=N`, `ENTRY:every=N` or `ENTRY:from=N`, comma-separated, each with
//! optional `:code=NAME` and `:sticky`. ENTRY is a driver entry point's exported name
//! (cuMemAlloc_v2, cuEventQuery, ...) or `*` for all of them. `after=N` fails the call after the first
//! N, once; `every=N` fails every Nth; `from=N` fails every call after the first N. The code defaults
//! to CUDA_ERROR_OUT_OF_MEMORY for the calls that take memory (cuMemAlloc_v2, cuMemCreate,
//! cuMemHostAlloc) and to CUDA_ERROR_UNKNOWN otherwise; a `sticky` fault also poisons the calling
//! thread's current context with CUDA_ERROR_LAUNCH_FAILED unless `code=` names another sticky error,
//! as a failed kernel does.

use crate::codes::{self, CuResult};

#[derive(Clone, Copy, PartialEq, Debug)]
enum When {
    After(u64),
    Every(u64),
    From(u64),
}

#[derive(Debug)]
struct Rule {
    entry: String,
    when: When,
    code: Option<CuResult>,
    sticky: bool,
    calls: u64,
}

/// What an injected fault returns.
pub struct Fault {
    pub code: CuResult,
    /// The context must be poisoned with `code`.
    pub sticky: bool,
}

#[derive(Default)]
pub struct Faults {
    rules: Vec<Rule>,
    /// Calls failed so far under these rules.
    pub fired: u64,
}

impl Faults {
    pub fn parse(spec: &str) -> Result<Faults, String> {
        let mut rules = Vec::new();
        for rule in spec.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let mut parts = rule.split(':').map(str::trim);
            let entry = parts.next().unwrap_or_default().to_string();
            if entry.is_empty() {
                return Err(format!("{rule}: no entry point named"));
            }
            let (mut when, mut code, mut sticky) = (None, None, false);
            for part in parts {
                let (key, value) = part.split_once('=').unwrap_or((part, ""));
                let count = || {
                    value
                        .parse::<u64>()
                        .ok()
                        .filter(|n| *n > 0 || key == "after" || key == "from")
                        .ok_or_else(|| format!("{rule}: {key}= wants a count"))
                };
                match key {
                    "after" => when = Some(When::After(count()?)),
                    "every" => when = Some(When::Every(count()?)),
                    "from" => when = Some(When::From(count()?)),
                    "code" => {
                        code = Some(codes::parse(value).ok_or_else(|| {
                            format!("{rule}: {value} is not a CUresult the model knows")
                        })?)
                    }
                    "sticky" => sticky = true,
                    _ => return Err(format!("{rule}: unknown part {part}")),
                }
            }
            let when = when.ok_or_else(|| format!("{rule}: after=, every= or from= is needed"))?;
            rules.push(Rule {
                entry,
                when,
                code,
                sticky,
                calls: 0,
            });
        }
        Ok(Faults { rules, fired: 0 })
    }

    /// Count a call of `entry` against every rule naming it; the first rule due fails it.
    pub fn check(&mut self, entry: &str) -> Option<Fault> {
        let mut fault = None;
        for rule in self
            .rules
            .iter_mut()
            .filter(|r| r.entry == "*" || r.entry == entry)
        {
            rule.calls += 1;
            let due = match rule.when {
                When::After(n) => rule.calls == n + 1,
                When::Every(n) => rule.calls % n == 0,
                When::From(n) => rule.calls > n,
            };
            if due && fault.is_none() {
                let takes_memory =
                    matches!(entry, "cuMemAlloc_v2" | "cuMemCreate" | "cuMemHostAlloc");
                let code = rule.code.unwrap_or(if rule.sticky {
                    codes::LAUNCH_FAILED
                } else if takes_memory {
                    codes::OUT_OF_MEMORY
                } else {
                    codes::UNKNOWN
                });
                fault = Some(Fault {
                    code,
                    sticky: rule.sticky && codes::is_sticky(code),
                });
            }
        }
        self.fired += fault.is_some() as u64;
        fault
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_every_and_from() {
        let mut f = Faults::parse(
            "cuMemAlloc_v2:after=2, cuEventQuery:every=3:code=INVALID_VALUE, cuMemMap:from=1",
        )
        .unwrap();
        let fails = |f: &mut Faults, entry: &str| {
            (0..6)
                .map(|_| f.check(entry).map(|x| x.code))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            fails(&mut f, "cuMemAlloc_v2"),
            [None, None, Some(codes::OUT_OF_MEMORY), None, None, None]
        );
        assert_eq!(
            fails(&mut f, "cuEventQuery"),
            [None, None, Some(1), None, None, Some(1)]
        );
        assert_eq!(
            fails(&mut f, "cuMemMap"),
            [None, Some(999), Some(999), Some(999), Some(999), Some(999)]
        );
        assert!(f.check("cuInit").is_none());
        let mut f = Faults::parse("cuMemHostAlloc:after=0").unwrap();
        let fault = f.check("cuMemHostAlloc").map(|x| x.code);
        assert_eq!(fault, Some(codes::OUT_OF_MEMORY), "pinning takes memory");
    }

    #[test]
    fn sticky_faults_poison_and_bad_rules_are_refused() {
        let mut f = Faults::parse("*:after=0:sticky").unwrap();
        let fault = f.check("cuEventRecord").unwrap();
        assert_eq!((fault.code, fault.sticky), (codes::LAUNCH_FAILED, true));
        for bad in [
            "cuInit",
            "cuInit:every=0",
            "cuInit:after=x",
            "cuInit:after=1:code=42",
            ":after=1",
            "cuInit:later=1",
        ] {
            assert!(Faults::parse(bad).is_err(), "{bad}");
        }
    }
}
