//! One case of an experiment: its devices and backends, its knobs (through the registry),
//! its workloads (`workload.rs`), and its times.

use std::path::Path;

use ebb_core::config::{self, Knob, Scope, Setting};
use ebb_core::{BackendConfig, Config, Duration};

use super::error::At;
use super::faults::{build_crash, build_fault};
use super::schema::{RawBackend, RawCase};
use super::units::{duration_value, size_value};
use super::workload::build_workload;
use super::{Case, DEFAULT_SAMPLE_INTERVAL, ExperimentError};

/// The shortest `sample_interval`: the charts and checks need no finer steps, and every sample
/// is an event of the simulation.
const MIN_SAMPLE_INTERVAL: Duration = Duration::from_millis(1);
/// The most samples a run may keep (`time_limit / sample_interval`). The longest built-in
/// experiment takes 200,000 (20000 s at the default 100 ms); `sample_interval = "1ns"` grew
/// until the machine ran out of memory (3.8 GB and an abort under a 6 GB limit).
const MAX_SAMPLES: u64 = 2_000_000;
use crate::device::{self, DeviceParams};
use crate::run::DeviceSpec;

pub(super) fn build_case(
    path: &Path,
    index: usize,
    compare: &Knob,
    raw: RawCase,
) -> Result<Case, ExperimentError> {
    let at = At::new(path, format!("case[{index}]"));
    if !is_plain_name(&raw.name) {
        return Err(at.fail(
            "name",
            format!("{:?} is not made of letters, digits, '.', '_' and '-'", raw.name),
        ));
    }
    let memory_bytes = size_value(&raw.memory).map_err(|reason| at.fail("memory", reason))?;
    let (time_limit, steady_from, sample_interval) = case_times(&at, &raw)?;
    if raw.backends.is_empty() {
        return Err(at.fail("backend", "at least one [[case.backend]] is needed".to_owned()));
    }
    if raw.workloads.is_empty() {
        return Err(at.fail("workload", "at least one [[case.workload]] is needed".to_owned()));
    }
    let (config, devices) = case_config(&at, &raw, memory_bytes, compare)?;
    let mut workloads = Vec::new();
    for (w, raw_workload) in raw.workloads.iter().enumerate() {
        let wkey = format!("workload[{w}]");
        workloads.push(build_workload(&at.below(&wkey), raw_workload, &config)?);
    }
    let names: Vec<&str> = raw.backends.iter().map(|b| b.name.as_str()).collect();
    let faults = raw
        .faults
        .iter()
        .enumerate()
        .map(|(f, fault)| {
            build_fault(fault, &names)
                .map_err(|(field, r)| at.fail(&format!("fault[{f}].{field}"), r))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let crash = match &raw.crash {
        Some(crash) => {
            Some(build_crash(crash).map_err(|(field, r)| at.fail(&format!("crash.{field}"), r))?)
        }
        None => None,
    };
    Ok(Case {
        faults,
        crash,
        name: raw.name,
        config,
        devices,
        workloads,
        time_limit,
        steady_from,
        sample_interval,
        settle_within: raw.settle_within,
    })
}

/// A case's time limit, the start of its steady state and its sample interval, checked (and
/// its `settle_within` band).
fn case_times(
    at: &At<'_>,
    raw: &RawCase,
) -> Result<(Duration, Duration, Duration), ExperimentError> {
    let time_limit = duration_value(&raw.time_limit).map_err(|r| at.fail("time_limit", r))?;
    let steady_from = match &raw.steady_from {
        Some(value) => duration_value(value).map_err(|r| at.fail("steady_from", r))?,
        None => Duration::ZERO,
    };
    let sample_interval = match &raw.sample_interval {
        Some(value) => duration_value(value).map_err(|r| at.fail("sample_interval", r))?,
        None => DEFAULT_SAMPLE_INTERVAL,
    };
    if time_limit == Duration::ZERO {
        return Err(at.fail("time_limit", "must be positive".to_owned()));
    }
    if let Some(band) = raw.settle_within
        && !(band > 0.0 && band < 1.0)
    {
        return Err(at.fail("settle_within", format!("{band} is not a fraction in (0, 1)")));
    }
    if sample_interval < MIN_SAMPLE_INTERVAL {
        let reason = format!("{sample_interval} is below the least, {MIN_SAMPLE_INTERVAL}");
        return Err(at.fail("sample_interval", reason));
    }
    let samples = time_limit.as_nanos() / sample_interval.as_nanos();
    if samples > MAX_SAMPLES {
        let reason = format!(
            "{sample_interval} over time_limit {time_limit} is {samples} samples per run, \
             more than {MAX_SAMPLES} (each sample is kept in memory): take a longer interval"
        );
        return Err(at.fail("sample_interval", reason));
    }
    Ok((time_limit, steady_from, sample_interval))
}

/// A case's engine configuration (its backends, at most one of them swap, then its global
/// knobs) and each backend's device model.
fn case_config(
    at: &At<'_>,
    raw: &RawCase,
    memory_bytes: u64,
    compare: &Knob,
) -> Result<(Config, Vec<DeviceSpec>), ExperimentError> {
    let mut backends: Vec<BackendConfig> = Vec::new();
    let mut devices = Vec::new();
    for (b, raw_backend) in raw.backends.iter().enumerate() {
        let bkey = |field: &str| format!("backend[{b}].{field}");
        if backends.iter().any(|existing| existing.name == raw_backend.name) {
            return Err(at.fail(&bkey("name"), format!("{:?} is used twice", raw_backend.name)));
        }
        let backend = build_backend(raw_backend, compare)
            .map_err(|(field, reason)| at.fail(&bkey(&field), reason))?;
        backends.push(backend);
        devices.push(DeviceSpec {
            model: raw_backend.device.clone(),
            overrides: raw_backend.device_overrides.clone(),
        });
    }
    let swaps: Vec<usize> =
        (0..raw.backends.len()).filter(|&b| raw.backends[b].swap == Some(true)).collect();
    if swaps.len() > 1 {
        return Err(at.fail(&format!("backend[{}].swap", swaps[1]), "a second swap backend".into()));
    }
    let mut backends_iter = backends.into_iter();
    let first = backends_iter.next().expect("at least one backend, checked before");
    let mut config = Config::new(memory_bytes, first);
    config.backends.extend(backends_iter);
    config.stage_for_granules();
    config.swap_backend = swaps.first().copied();
    for setting in knob_settings(&raw.knobs, Scope::Global, compare)
        .map_err(|(key, reason)| at.fail(&format!("knobs.{key}"), reason))?
    {
        setting.apply(&mut config);
    }
    Ok((config, devices))
}

/// One backend: the settings the kernel would give its device model, then its knobs. Errors
/// give the backend's field and the reason.
fn build_backend(raw: &RawBackend, compare: &Knob) -> Result<BackendConfig, (String, String)> {
    let built =
        device::by_name_with_overrides(&raw.device, 0, &raw.device_overrides).map_err(|error| {
            let field = match error {
                device::DeviceError::UnknownModel { .. } => "device",
                _ => "device_overrides",
            };
            (field.to_owned(), error.to_string())
        })?;
    // The device's own command queue depth sizes writeback throttling (blk_queue_depth).
    let (rotational, write_cache, hw_queue_depth) = match built.params() {
        DeviceParams::Disk(p) => (true, p.write_cache_bytes > 0, p.queue_depth),
        DeviceParams::Raid0(p) => {
            (true, p.member.write_cache_bytes > 0, p.member.queue_depth * p.member_count)
        }
        DeviceParams::Flash(p) => (false, p.write_cache_bytes > 0, p.queue_depth),
        // Server memory is no device write cache: the client never flushes it.
        DeviceParams::Nfs(_) => (false, false, 32),
    };
    let mut backend = BackendConfig::new(raw.name.clone());
    if let DeviceParams::Nfs(p) = built.params() {
        // The NFS client assembles WRITE RPCs of up to wsize. It has no block request
        // queue: a writepages call hands every request to the RPC layer at once, whose TCP
        // slot table grows on demand up to 65536 entries (sunrpc's
        // tcp_max_slot_table_entries default), and requests beyond what the link carries
        // wait in the client's transmit queue. Its congestion flag (nfs_congestion_kb) did
        // not end a writepages call in the 2020 kernels (only reclaim looked at it), so it
        // is not modelled.
        backend.max_write_pages = (p.wsize_bytes / ebb_core::PAGE_SIZE) as u32;
        backend.queue_depth = 65_536;
    }
    backend.rotational = rotational;
    backend.write_cache = write_cache;
    backend.declared_write_bandwidth = Some(built.params().declared_write_bandwidth());
    backend.hw_queue_depth = hw_queue_depth.max(1);
    for setting in knob_settings(&raw.knobs, Scope::Backend, compare)? {
        setting.apply_backend(&mut backend).map_err(|e| (e.knob, e.reason))?;
    }
    Ok(backend)
}

/// The knobs of a table (a case's `knobs`, or a backend's keys besides its device), parsed by
/// the registry; every key must be a knob of `scope` other than the compared one. Errors give
/// the key and the reason.
pub(super) fn knob_settings(
    table: &toml::Table,
    scope: Scope,
    compare: &Knob,
) -> Result<Vec<Setting>, (String, String)> {
    let mut settings = Vec::new();
    for (name, value) in table {
        let fail = |reason: String| (name.clone(), reason);
        let knob = config::knob(name).map_err(|error| fail(error.reason))?;
        if knob.scope != scope {
            return Err(fail(match scope {
                Scope::Global => "a per-backend knob: set it in [[case.backend]]".to_owned(),
                Scope::Backend => "a cache knob: set it in the case's knobs".to_owned(),
            }));
        }
        if knob == compare {
            return Err(fail(format!(
                "`{name}` is the compared knob (`compare`); its values come from `variants`"
            )));
        }
        let text = knob_text(value).map_err(fail)?;
        settings.push(knob.parse(&text).map_err(|error| fail(error.reason))?);
    }
    Ok(settings)
}

/// A knob's value as written in TOML, as the text the registry parses.
pub(super) fn knob_text(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(items) => {
            let texts = items.iter().map(knob_text).collect::<Result<Vec<_>, _>>()?;
            Ok(texts.join(","))
        }
        other => Err(format!(
            "expected an integer, a boolean, a string or an array, found {}",
            other.type_str()
        )),
    }
}

pub(super) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !name.starts_with('.')
}
