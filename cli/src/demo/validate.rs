//! The demo's numeric flags and profile values, checked before anything runs: an out-of-range
//! or non-finite number is a usage error naming its flag (exit code 3), never a panic in a
//! `Duration` or an `Instant` further on. The bounds are wide (a model 10^6 times slower, ten
//! years of run time) and keep every time the demo derives from them representable.

use super::{DemoArgs, Dist};
use crate::Failure;
use std::time::Duration;

/// The longest `--duration`, `--linger`, `--rendezvous-timeout`, `--straggler-period` or
/// `--straggler-after`: ten years, as `--forever`'s horizon (an `Instant` that far ahead is
/// representable).
pub(super) const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;
/// The largest `--time-scale`, `--straggler-factor`, `--slow-factor` and `--route-skew`.
pub(super) const MAX_FACTOR: f64 = 1e6;
/// The largest `mean_us` of a profile entry: 1,000 s per section.
pub(super) const MAX_MEAN_US: f64 = 1e9;
/// The largest `cv` of a profile entry.
pub(super) const MAX_CV: f64 = 100.0;

/// `value` within `lo..=hi` (`lo` excluded when `open`), else the flag's error.
fn within(flag: &str, value: f64, lo: f64, open: bool, hi: f64, what: &str) -> Result<(), Failure> {
    let above = if open { value > lo } else { value >= lo };
    if value.is_finite() && above && value <= hi {
        Ok(())
    } else {
        Err(Failure::config(format!("{flag} {value}: expected {what}")))
    }
}

impl DemoArgs {
    /// Checks every numeric flag against the others and the bounds above.
    pub(crate) fn validate(&self) -> Result<(), Failure> {
        let secs = |flag, v| {
            within(
                flag,
                v,
                0.0,
                true,
                MAX_SECONDS,
                &format!("a positive number of seconds, at most {MAX_SECONDS} (ten years)"),
            )
        };
        let factor = |flag, v, lo, open, what: &str| {
            within(
                flag,
                v,
                lo,
                open,
                MAX_FACTOR,
                &format!("{what}, at most {MAX_FACTOR}"),
            )
        };
        factor(
            "--time-scale",
            self.time_scale,
            0.0,
            true,
            "a positive number",
        )?;
        if !(0.0..=1.0).contains(&self.acceptance) {
            return Err(Failure::config(format!(
                "--acceptance {}: expected a probability from 0 to 1",
                self.acceptance
            )));
        }
        factor(
            "--straggler-factor",
            self.straggler_factor,
            1.0,
            false,
            "a number of at least 1",
        )?;
        for (flag, rank) in [
            ("--straggler-rank", self.straggler_rank),
            ("--hang-rank", self.hang_rank),
            ("--rank", self.rank),
        ] {
            if let Some(r) = rank
                && r >= self.ranks
            {
                return Err(Failure::config(format!(
                    "{flag} {r}: expected a rank below --ranks {}",
                    self.ranks
                )));
            }
        }
        secs("--rendezvous-timeout", self.rendezvous_timeout)?;
        factor(
            "--route-skew",
            self.route_skew,
            0.0,
            true,
            "a positive number (1: uniform routing)",
        )?;
        if let Some(n) = self.expert_parallel
            && (n > self.ranks || n > self.experts)
        {
            return Err(Failure::config(format!(
                "--expert-parallel {n}: expected at most --ranks {} and at most --experts {}",
                self.ranks, self.experts
            )));
        }
        factor(
            "--slow-factor",
            self.slow_factor,
            1.0,
            false,
            "a number of at least 1",
        )?;
        if let Some(d) = self.duration {
            secs("--duration", d)?;
        }
        if let Some(p) = self.straggler_period {
            secs("--straggler-period", p)?;
        }
        if self.straggler_after != 0.0 {
            secs("--straggler-after", self.straggler_after).map_err(|_| {
                Failure::config(format!(
                    "--straggler-after {}: expected 0 or a positive number of seconds, at most {MAX_SECONDS} (ten years)",
                    self.straggler_after
                ))
            })?;
        }
        if self.linger != 0.0 {
            secs("--linger", self.linger).map_err(|_| {
                Failure::config(format!(
                    "--linger {}: expected 0 or a positive number of seconds, at most {MAX_SECONDS} (ten years)",
                    self.linger
                ))
            })?;
        }
        Ok(())
    }
}

/// A profile entry's `mean_us` and `cv`, each named in its error.
pub(super) fn profile_entry(
    bucket: &str,
    mean_us: Option<f64>,
    cv: Option<f64>,
) -> Result<Dist, String> {
    let ok = |v: f64, hi: f64| v.is_finite() && (0.0..=hi).contains(&v);
    let mean_us = mean_us.filter(|v| ok(*v, MAX_MEAN_US)).ok_or_else(|| {
        format!("{bucket}.mean_us: expected a non-negative number of microseconds, at most {MAX_MEAN_US}")
    })?;
    let cv = match cv {
        None => 0.1,
        Some(cv) if ok(cv, MAX_CV) => cv,
        Some(_) => {
            return Err(format!(
                "{bucket}.cv: expected a non-negative number, at most {MAX_CV}"
            ));
        }
    };
    Ok(Dist { mean_us, cv })
}

/// A simulated kernel's time: `us` drawn, scaled by `--time-scale` and a slowdown; saturates at
/// the hung kernel's horizon, so that no draw or product of factors can overflow a `Duration`.
pub(super) fn kernel_time(us: f64, scale: f64, factor: f64) -> Duration {
    let secs = us * 1e-6 * scale * factor;
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).map_or(super::FOREVER, |d| d.min(super::FOREVER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use proptest::prelude::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    /// Any number as a flag would spell it: ordinary, huge, tiny, negative, non-finite.
    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<f64>().prop_map(|x| x.to_string()),
            (-400i32..400, any::<bool>())
                .prop_map(|(e, neg)| format!("{}1e{e}", if neg { "-" } else { "" })),
            Just("inf".to_owned()),
            Just("-inf".to_owned()),
            Just("NaN".to_owned()),
            Just("1e300".to_owned()),
            Just("1e308".to_owned()),
            Just("0".to_owned()),
            (0.0f64..100.0).prop_map(|x| x.to_string()),
        ]
    }

    const FLAGS: [&str; 9] = [
        "--duration",
        "--linger",
        "--rendezvous-timeout",
        "--time-scale",
        "--straggler-factor",
        "--slow-factor",
        "--straggler-period",
        "--route-skew",
        "--acceptance",
    ];

    /// Every time the demo derives from its flags, as `run` derives them.
    fn derived_times(a: &DemoArgs) {
        if let Some(d) = a.duration {
            let _ = std::time::Instant::now() + Duration::from_secs_f64(d);
        }
        let _ = std::time::Instant::now() + Duration::from_secs_f64(a.linger);
        let _ = std::time::Instant::now() + Duration::from_secs_f64(a.rendezvous_timeout);
        let worst = a.straggler_factor.max(a.slow_factor) * 64.0 * 65_536.0;
        let _ = kernel_time(MAX_MEAN_US * 1e3, a.time_scale, worst);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn no_numeric_flag_value_panics(flag in 0..FLAGS.len(), value in number(), other in 0..FLAGS.len(), v2 in number()) {
            let argv = ["demo", FLAGS[flag], &value, FLAGS[other], &v2];
            // clap refuses what is no number at all (exit 2); the rest is validated.
            if let Ok(cli) = Cli::try_parse_from(argv) {
                match cli.demo.validate() {
                    Ok(()) => derived_times(&cli.demo),
                    Err(f) => {
                        prop_assert_eq!(f.code, 3);
                        prop_assert!(
                            f.message.contains(FLAGS[flag]) || f.message.contains(FLAGS[other]),
                            "{} does not name the flag", f.message
                        );
                    }
                }
            }
        }

        #[test]
        fn no_profile_value_panics(mean in number(), cv in proptest::option::of(number())) {
            let text = match &cv {
                Some(cv) => format!(r#"{{"draft": {{"mean_us": {mean}, "cv": {cv}}}}}"#),
                None => format!(r#"{{"draft": {{"mean_us": {mean}}}}}"#),
            };
            let dir = std::env::temp_dir().join(format!("phasetrace-profile-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("profile.json");
            std::fs::write(&path, &text).unwrap();
            let mut dists = super::super::default_dists();
            match super::super::load_profile(&path, &mut dists) {
                Ok(()) => {
                    let d = dists["draft"];
                    prop_assert!(d.mean_us <= MAX_MEAN_US && d.cv <= MAX_CV);
                    // Draws of the distribution, at the largest factors the flags allow.
                    let mut work = super::super::Work::new(&dists, 7, MAX_FACTOR, Duration::ZERO, None);
                    if let Some((dist, _)) = work.dists.get("draft") {
                        for _ in 0..16 {
                            let us: f64 = rand_distr::Distribution::sample(dist, &mut work.rng);
                            let _ = kernel_time(us, MAX_FACTOR, MAX_FACTOR * 64.0);
                        }
                    }
                }
                Err(f) => {
                    prop_assert_eq!(f.code, 3);
                    prop_assert!(f.message.contains("draft.") || f.message.contains("not JSON"), "{}", f.message);
                }
            }
        }
    }

    #[test]
    fn the_reported_values_are_usage_errors_naming_the_flag() {
        for (flag, value) in [
            ("--linger", "inf"),
            ("--duration", "1e300"),
            ("--rendezvous-timeout", "1e300"),
            ("--time-scale", "1e300"),
            ("--straggler-factor", "1e300"),
            ("--slow-factor", "1e300"),
        ] {
            let cli = Cli::try_parse_from(["demo", flag, value]).unwrap();
            let f = cli.demo.validate().unwrap_err();
            assert_eq!(f.code, 3);
            assert!(f.message.contains(flag), "{}", f.message);
        }
        assert_eq!(kernel_time(1e308, 1e6, 1e6), super::super::FOREVER);
        assert_eq!(kernel_time(f64::NAN, 1.0, 1.0), Duration::ZERO);
    }
}
