//! The workloads of a case, from their file form to the run's [`Workload`]s.

use ebb_core::{Config, Duration};

use super::ExperimentError;
use super::error::At;
use super::schema::RawWorkload;
use super::units::{duration_value, size_value};
use crate::memload::MemoryWorkload;
use crate::run::Workload;

pub(super) fn build_workload(
    ctx: &At<'_>,
    raw: &RawWorkload,
    config: &Config,
) -> Result<Workload, ExperimentError> {
    let fail = |field: &str, reason: String| ctx.fail(field, reason);
    let backend = workload_backend(ctx, raw, config)?;
    let (size_bytes, bs_bytes, start) = workload_extent(ctx, raw)?;
    if raw.kind != "dd"
        && (raw.truncate_at.is_some() || raw.truncate_to.is_some() || raw.unlink.is_some())
    {
        return Err(fail(
            "kind",
            format!("{} takes no truncate_at, truncate_to or unlink", raw.kind),
        ));
    }
    match raw.kind.as_str() {
        "dd" => {
            let think = match &raw.think {
                Some(value) => duration_value(value).map_err(|r| fail("think", r))?,
                None => Duration::ZERO,
            };
            let truncate = dd_truncate(raw, size_bytes).map_err(|(f, r)| fail(f, r))?;
            Ok(Workload::Dd {
                backend,
                size_bytes,
                bs_bytes,
                start,
                fsync: raw.fsync.unwrap_or(false),
                think,
                truncate,
                unlink: raw.unlink.unwrap_or(false),
            })
        }
        "cp" => {
            if raw.fsync.is_some() {
                return Err(fail("fsync", "cp takes no fsync; use a dd workload".to_owned()));
            }
            if raw.think.is_some() {
                return Err(fail("think", "cp takes no think time".to_owned()));
            }
            Ok(Workload::Cp { backend, size_bytes, bs_bytes, start })
        }
        "randread" => {
            if raw.fsync.is_some() || raw.think.is_some() {
                return Err(fail("kind", "randread takes no fsync or think time".to_owned()));
            }
            if bs_bytes % 4096 != 0 || size_bytes < bs_bytes {
                return Err(fail(
                    "bs",
                    "randread needs a multiple of 4 KiB no larger than size".to_owned(),
                ));
            }
            Ok(Workload::RandomReader { backend, size_bytes, bs_bytes, start })
        }
        "fsmark" | "mmap-strm" | "anon-churn" => {
            if raw.fsync.is_some() || raw.think.is_some() {
                return Err(fail("kind", format!("{} takes no fsync or think time", raw.kind)));
            }
            let memory = memory_workload(raw, backend, size_bytes, bs_bytes, start)
                .map_err(|(field, reason)| fail(&field, reason))?;
            Ok(Workload::Memory(memory))
        }
        other => Err(fail(
            "kind",
            format!(
                "unknown workload kind {other:?}; expected dd, cp, randread, fsmark, mmap-strm \
                 or anon-churn"
            ),
        )),
    }
}

/// The index of the backend a workload names (the case's only one if it names none).
fn workload_backend(
    ctx: &At<'_>,
    raw: &RawWorkload,
    config: &Config,
) -> Result<usize, ExperimentError> {
    match &raw.backend {
        Some(name) => config.backends.iter().position(|b| &b.name == name).ok_or_else(|| {
            let known: Vec<&str> = config.backends.iter().map(|b| b.name.as_str()).collect();
            let reason = format!("no backend named {name:?}; the case has {}", known.join(", "));
            ctx.fail("backend", reason)
        }),
        None if config.backends.len() == 1 => Ok(0),
        None => Err(ctx.fail("backend", "the case has several backends; name one".to_owned())),
    }
}

/// A workload's size and block size in bytes (1 MiB blocks unless it says), checked, and when
/// it starts.
fn workload_extent(
    ctx: &At<'_>,
    raw: &RawWorkload,
) -> Result<(u64, u64, Duration), ExperimentError> {
    let size_bytes = size_value(&raw.size).map_err(|r| ctx.fail("size", r))?;
    let bs_bytes = match &raw.bs {
        Some(value) => size_value(value).map_err(|r| ctx.fail("bs", r))?,
        None => 1 << 20,
    };
    if size_bytes == 0 {
        return Err(ctx.fail("size", "must be positive".to_owned()));
    }
    if bs_bytes == 0 || bs_bytes > 1 << 30 {
        return Err(ctx.fail("bs", format!("{bs_bytes} bytes is outside 1 byte..1 GiB")));
    }
    let start = match &raw.start {
        Some(value) => duration_value(value).map_err(|r| ctx.fail("start", r))?,
        None => Duration::ZERO,
    };
    Ok((size_bytes, bs_bytes, start))
}

/// An fsmark, mmap-strm or anon-churn workload (`crate::memload`). Errors give the field.
fn memory_workload(
    raw: &RawWorkload,
    backend: usize,
    size_bytes: u64,
    bs_bytes: u64,
    start: Duration,
) -> Result<MemoryWorkload, (String, String)> {
    let fail = |field: &str, reason: String| (field.to_owned(), reason);
    let size_of = |field: &str, value: &Option<toml::Value>| match value {
        Some(value) => size_value(value).map_err(|r| fail(field, r)),
        None => Err(fail(field, format!("{} needs {field}", raw.kind))),
    };
    let duration_of = |field: &str, value: &Option<toml::Value>| match value {
        Some(value) => duration_value(value).map_err(|r| fail(field, r)),
        None => Err(fail(field, format!("{} needs {field}", raw.kind))),
    };
    let memory = match raw.kind.as_str() {
        "fsmark" => MemoryWorkload::FsMark {
            backend,
            size_bytes,
            file_bytes: size_of("file_size", &raw.file_size)?,
            bs_bytes,
            threads: raw.threads.unwrap_or(1),
            start,
        },
        "mmap-strm" => MemoryWorkload::MmapStrm {
            backend,
            size_bytes,
            mix_bytes: size_of("mix", &raw.mix)?,
            chunk_bytes: size_of("chunk", &raw.chunk)?,
            bs_bytes,
            start,
        },
        _ => MemoryWorkload::AnonChurn {
            size_bytes,
            hold: duration_of("hold", &raw.hold)?,
            period: duration_of("period", &raw.period)?,
            start,
        },
    };
    memory.validate().map_err(|(field, reason)| fail(field, reason))?;
    Ok(memory)
}

/// A dd's `truncate_at` and `truncate_to` (both or neither; `to` below `at`, `at` within the
/// size).
fn dd_truncate(
    raw: &RawWorkload,
    size_bytes: u64,
) -> Result<Option<(u64, u64)>, (&'static str, String)> {
    let (at, to) = match (&raw.truncate_at, &raw.truncate_to) {
        (None, None) => return Ok(None),
        (Some(at), Some(to)) => (
            size_value(at).map_err(|r| ("truncate_at", r))?,
            size_value(to).map_err(|r| ("truncate_to", r))?,
        ),
        _ => return Err(("truncate_at", "truncate_at and truncate_to go together".to_owned())),
    };
    if at == 0 || at > size_bytes {
        return Err(("truncate_at", format!("{at} is outside 1..=size ({size_bytes})")));
    }
    if to >= at {
        return Err(("truncate_to", format!("{to} must be below truncate_at ({at})")));
    }
    Ok(Some((at, to)))
}
