//! A case's fault windows (`[[case.fault]]`) and crash (`crash`), as `run::Fault` and
//! `run::Crash`. Errors give the field and the reason.

use ebb_core::Duration;
use ebb_core::event::errno;

use super::schema::{RawCrash, RawFault};
use super::units::duration_value;
use crate::run::{Crash, Fault};

/// The errno names a fault may use, with their numbers.
pub const ERRNO_NAMES: [(&str, i32); 10] = [
    ("EIO", errno::EIO),
    ("ENOSPC", errno::ENOSPC),
    ("EROFS", errno::EROFS),
    ("EDQUOT", errno::EDQUOT),
    ("EFBIG", errno::EFBIG),
    ("ESTALE", errno::ESTALE),
    ("EAGAIN", errno::EAGAIN),
    ("ETIMEDOUT", errno::ETIMEDOUT),
    ("ECONNREFUSED", errno::ECONNREFUSED),
    ("ECONNRESET", errno::ECONNRESET),
];

/// The name of `errno` if it has one in [`ERRNO_NAMES`].
pub fn errno_name(number: i32) -> Option<&'static str> {
    ERRNO_NAMES.iter().find(|(_, n)| *n == number).map(|(name, _)| *name)
}

fn errno_value(value: &toml::Value) -> Result<i32, String> {
    match value {
        toml::Value::Integer(n) if (1..=4095).contains(n) => Ok(*n as i32),
        toml::Value::Integer(n) => Err(format!("{n} is not an errno (1..=4095)")),
        toml::Value::String(name) => ERRNO_NAMES
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|(_, n)| *n)
            .ok_or_else(|| {
                let known: Vec<&str> = ERRNO_NAMES.iter().map(|(n, _)| *n).collect();
                format!("unknown errno {name:?}; expected a number or one of {}", known.join(", "))
            }),
        other => Err(format!("expected an errno number or name, found {}", other.type_str())),
    }
}

pub(super) fn build_fault(raw: &RawFault, backends: &[&str]) -> Result<Fault, (String, String)> {
    let fail = |field: &str, reason: String| (field.to_owned(), reason);
    let backend = match &raw.backend {
        Some(name) => backends.iter().position(|b| b == name).ok_or_else(|| {
            fail(
                "backend",
                format!("no backend named {name:?}; the case has {}", backends.join(", ")),
            )
        })?,
        None if backends.len() == 1 => 0,
        None => return Err(fail("backend", "the case has several backends; name one".into())),
    };
    let from = duration_value(&raw.from).map_err(|r| fail("from", r))?;
    let until = match &raw.until {
        Some(value) => Some(duration_value(value).map_err(|r| fail("until", r))?),
        None => None,
    };
    if until.is_some_and(|until| until <= from) {
        return Err(fail("until", "must be after `from`".into()));
    }
    let errno = match &raw.errno {
        Some(value) => errno_value(value).map_err(|r| fail("errno", r))?,
        None => 0,
    };
    let read_errno = match &raw.read_errno {
        Some(value) => errno_value(value).map_err(|r| fail("read_errno", r))?,
        None => 0,
    };
    let delay = match &raw.delay {
        Some(value) => duration_value(value).map_err(|r| fail("delay", r))?,
        None => Duration::ZERO,
    };
    if errno == 0 && read_errno == 0 && delay == Duration::ZERO {
        return Err(fail("errno", "a fault needs an errno, a read_errno or a delay".into()));
    }
    Ok(Fault { backend, errno, read_errno, from, until, delay })
}

pub(super) fn build_crash(raw: &RawCrash) -> Result<Crash, (String, String)> {
    let at = duration_value(&raw.at).map_err(|r| ("at".to_owned(), r))?;
    Ok(Crash {
        at,
        power_cut: raw.power_cut.unwrap_or(false),
        restart: raw.restart.unwrap_or(false),
    })
}
