//! `ScalarPrinter`: logs the scalars of each epoch (`name: value`, sorted by name, 5 significant
//! digits), optionally at every step too, filtered by regex white- and blacklists.

use std::collections::BTreeMap;

use regex::Regex;

use crate::train::error::{ConfigError, TrainError};

use super::{MonitorSetup, StepStamp, TrainingMonitor};

/// Prints the latest value of every scalar put since the last print.
#[derive(Debug)]
pub struct ScalarPrinter {
    enable_step: bool,
    enable_epoch: bool,
    whitelist: Option<Vec<Regex>>,
    blacklist: Vec<Regex>,
    pending: BTreeMap<String, f64>,
    printed: Vec<String>,
}

impl Default for ScalarPrinter {
    fn default() -> ScalarPrinter {
        ScalarPrinter::new()
    }
}

/// `value` with 5 significant digits, like Python's `{:.5g}`.
pub fn format_5g(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    let exp = value.abs().log10().floor() as i32;
    if !(-4..5).contains(&exp) {
        let s = format!("{value:.4e}");
        // Trim trailing zeros of the mantissa: 1.2000e5 -> 1.2e5.
        return match s.split_once('e') {
            Some((m, e)) if m.contains('.') => {
                let m = m.trim_end_matches('0').trim_end_matches('.');
                format!("{m}e{e}")
            }
            _ => s,
        };
    }
    let decimals = (4 - exp).max(0) as usize;
    let s = format!("{value:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

impl ScalarPrinter {
    /// Prints at every epoch end, not at steps, every scalar.
    pub fn new() -> ScalarPrinter {
        ScalarPrinter {
            enable_step: false,
            enable_epoch: true,
            whitelist: None,
            blacklist: Vec::new(),
            pending: BTreeMap::new(),
            printed: Vec::new(),
        }
    }

    /// Also print after every step.
    pub fn enable_step(mut self, on: bool) -> Self {
        self.enable_step = on;
        self
    }

    /// Print at epoch ends (default on).
    pub fn enable_epoch(mut self, on: bool) -> Self {
        self.enable_epoch = on;
        self
    }

    /// Only names matching one of these regexes (searched anywhere in the name).
    pub fn whitelist(mut self, patterns: &[&str]) -> Result<Self, TrainError> {
        self.whitelist = Some(compile(patterns)?);
        Ok(self)
    }

    /// Never names matching one of these regexes.
    pub fn blacklist(mut self, patterns: &[&str]) -> Result<Self, TrainError> {
        self.blacklist = compile(patterns)?;
        Ok(self)
    }

    /// Every line printed so far.
    pub fn printed(&self) -> &[String] {
        &self.printed
    }

    fn wanted(&self, name: &str) -> bool {
        let white = self
            .whitelist
            .as_ref()
            .is_none_or(|w| w.iter().any(|r| r.is_match(name)));
        white && !self.blacklist.iter().any(|r| r.is_match(name))
    }

    fn print(&mut self) {
        for (name, value) in std::mem::take(&mut self.pending) {
            let line = format!("{name}: {}", format_5g(value));
            log::info!(target: "towerpack", "{line}");
            self.printed.push(line);
        }
    }
}

fn compile(patterns: &[&str]) -> Result<Vec<Regex>, TrainError> {
    patterns
        .iter()
        .map(|p| {
            Regex::new(p).map_err(|source| {
                ConfigError::BadRegex {
                    who: "ScalarPrinter".into(),
                    pattern: p.to_string(),
                    source,
                }
                .into()
            })
        })
        .collect()
}

impl TrainingMonitor for ScalarPrinter {
    fn setup(&mut self, _: &MonitorSetup) -> Result<(), TrainError> {
        self.print();
        Ok(())
    }

    fn process_scalar(&mut self, name: &str, value: f64, _: &StepStamp) -> Result<(), TrainError> {
        if self.wanted(name) {
            self.pending.insert(name.to_string(), value);
        }
        Ok(())
    }

    fn trigger_step(&mut self, _: &StepStamp) -> Result<(), TrainError> {
        if self.enable_step {
            self.print();
        }
        Ok(())
    }

    fn trigger_epoch(&mut self, _: &StepStamp) -> Result<(), TrainError> {
        if self.enable_epoch {
            self.print();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::format_5g;

    #[test]
    fn five_significant_digits_like_python() {
        assert_eq!(format_5g(0.123456789), "0.12346");
        assert_eq!(format_5g(12345.678), "12346");
        assert_eq!(format_5g(2.5), "2.5");
        assert_eq!(format_5g(0.0), "0");
        assert_eq!(format_5g(123456.0), "1.2346e5");
        assert_eq!(format_5g(0.000012345), "1.2345e-5");
    }
}
