//! Trace events in the kernel's tracepoint formats (docs/mechanisms.md#tracepoints), so traces can
//! be read with the tools and habits kernel developers already have.
//!
//! The engine records events only when `Config::trace` is set; drivers drain them with
//! [`crate::Engine::drain_trace`] and render them with [`TraceEvent::render`], which takes the
//! backend names (the kernel prints `bdi=<name>`). Rates are KB/s and times ms, as the kernel
//! prints them.

use crate::ids::{BackendId, InodeId, WriterId};

/// One decision of the engine, with the inputs that caused it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceEvent {
    /// `writeback:balance_dirty_pages` (IO-less policy).
    BalanceDirtyPages {
        /// The writer (the kernel's task).
        writer: WriterId,
        /// Its backend.
        bdi: BackendId,
        /// Global hard limit, pages.
        limit: u64,
        /// Global setpoint, pages.
        setpoint: u64,
        /// Global dirty + writeback, pages.
        dirty: u64,
        /// The backend's setpoint, pages.
        bdi_setpoint: u64,
        /// The backend's dirty + writeback, pages.
        bdi_dirty: u64,
        /// Base ratelimit, KB/s.
        dirty_ratelimit_kbps: u64,
        /// This writer's rate, KB/s.
        task_ratelimit_kbps: u64,
        /// Pages dirtied since the last check.
        dirtied: u64,
        /// Pages until the next check.
        dirtied_pause: u64,
        /// Time already spent in this call, ms.
        paused_ms: i64,
        /// Pause, ms (<= 0: no sleep).
        pause_ms: i64,
        /// Pause before think-time credit, ms.
        period_ms: i64,
        /// Time since the writer's last paid-up point, ms.
        think_ms: i64,
    },
    /// The 2.6.3x `balance_dirty_pages` line of the posting's "before" trace.
    LegacyBalanceDirtyPages {
        /// The writer.
        writer: WriterId,
        /// Its backend.
        bdi: BackendId,
        /// Pages the writer had to write.
        write_chunk: u64,
        /// Pages it wrote.
        pages_written: u64,
        /// Total time in the call, ms.
        pause_ms: u64,
    },
    /// `balance_dirty_pages` as the September 2010 posting printed it for its bandwidth
    /// control (one line per soft pause).
    Bw2010BalanceDirtyPages {
        /// The writer.
        writer: WriterId,
        /// Its backend.
        bdi: BackendId,
        /// The writer's share of recent dirtying, percent.
        weight_pct: u64,
        /// The writer's limit on the backend (the posting's A), pages.
        thresh: u64,
        /// A minus the backend's dirty and writeback pages, pages.
        gap: u64,
        /// Pages dirtied since the last call.
        dirtied: u64,
        /// The pause, ms.
        pause_ms: u64,
        /// The throttle bandwidth, bytes per second.
        bw: u64,
    },
    /// `writeback:writeback_single_inode`: one writepages call on a file ended (for NFS, one
    /// `nfs_writepages`), with the pages it wrote (0: it found nothing it could write).
    Writepages {
        /// The backend.
        bdi: BackendId,
        /// The file.
        inode: InodeId,
        /// Pages written by the call.
        wrote: u64,
    },
    /// `nfs:nfs_initiate_commit`: a COMMIT sent for the file's unstable pages.
    Commit {
        /// The backend.
        bdi: BackendId,
        /// The file.
        inode: InodeId,
        /// Pages it covers.
        pages: u64,
    },
    /// `writeback:bdi_dirty_ratelimit`, KB/s.
    BdiDirtyRatelimit {
        /// The backend.
        bdi: BackendId,
        /// Write bandwidth.
        write_bw_kbps: u64,
        /// Smoothed write bandwidth.
        avg_write_bw_kbps: u64,
        /// Measured dirty rate.
        dirty_rate_kbps: u64,
        /// Base ratelimit.
        dirty_ratelimit_kbps: u64,
        /// Rate at the current position.
        task_ratelimit_kbps: u64,
        /// Balanced ratelimit estimate.
        balanced_dirty_ratelimit_kbps: u64,
    },
    /// `writeback:writeback_start`.
    WritebackStart {
        /// The backend.
        bdi: BackendId,
        /// Pages asked for.
        nr_pages: u64,
        /// Reason name.
        reason: &'static str,
        /// Integrity (sync) work.
        sync_all: bool,
    },
    /// `writeback:writeback_written`.
    WritebackWritten {
        /// The backend.
        bdi: BackendId,
        /// Pages written by the work.
        written: u64,
        /// Reason name.
        reason: &'static str,
    },
    /// `wbt:wbt_stat` with `wbt:wbt_step` (when the limits changed) and `wbt:wbt_timer`: one
    /// window evaluation of writeback throttling.
    Wbt {
        /// The device.
        bdi: BackendId,
        /// What the window saw and did.
        eval: crate::wbt::Evaluation,
        /// Writes in flight.
        inflight: u32,
    },
    /// `writeback:writeback_queue_io`.
    QueueIo {
        /// The backend.
        bdi: BackendId,
        /// Files moved to the io list.
        moved: u64,
        /// Reason name.
        reason: &'static str,
    },
    /// `writeback:global_dirty_state` (the kernel's format while it counted unstable pages):
    /// the cache's pages against its thresholds, pages.
    GlobalDirtyState {
        /// Dirty pages.
        dirty: u64,
        /// Pages under writeback.
        writeback: u64,
        /// Written, not yet committed.
        unstable: u64,
        /// Background threshold.
        bg_thresh: u64,
        /// Dirty threshold.
        thresh: u64,
        /// Hard limit.
        limit: u64,
        /// Pages dirtied, ever.
        dirtied: u64,
        /// Pages written, ever.
        written: u64,
    },
}

impl TraceEvent {
    /// The tracepoint's name.
    pub fn name(&self) -> &'static str {
        match self {
            TraceEvent::BalanceDirtyPages { .. }
            | TraceEvent::LegacyBalanceDirtyPages { .. }
            | TraceEvent::Bw2010BalanceDirtyPages { .. } => "balance_dirty_pages",
            TraceEvent::BdiDirtyRatelimit { .. } => "bdi_dirty_ratelimit",
            TraceEvent::WritebackStart { .. } => "writeback_start",
            TraceEvent::WritebackWritten { .. } => "writeback_written",
            TraceEvent::Writepages { .. } => "writeback_single_inode",
            TraceEvent::Commit { .. } => "nfs_initiate_commit",
            TraceEvent::QueueIo { .. } => "writeback_queue_io",
            TraceEvent::Wbt { .. } => "wbt_timer",
            TraceEvent::GlobalDirtyState { .. } => "global_dirty_state",
        }
    }

    /// The writer this event belongs to, if any (the kernel prints the task).
    pub fn writer(&self) -> Option<WriterId> {
        match self {
            TraceEvent::BalanceDirtyPages { writer, .. }
            | TraceEvent::LegacyBalanceDirtyPages { writer, .. }
            | TraceEvent::Bw2010BalanceDirtyPages { writer, .. } => Some(*writer),
            _ => None,
        }
    }

    /// The event as lines of a trace file in the kernel's text format (`trace_pipe`'s):
    /// `TASK [000] SECONDS: name: fields`, one line per tracepoint (a wbt evaluation is up to
    /// three), each ending in a newline. `task` is the kernel's `comm-pid`, `at` the time since
    /// the trace began.
    pub fn text_lines(&self, at: crate::Instant, task: &str, bdis: &[String]) -> String {
        let mut out = String::new();
        for line in self.render(bdis).lines() {
            out.push_str(&format!("{task:>16} [000] {:>13.6}: {line}\n", at.as_secs_f64()));
        }
        out
    }

    /// `name: fields` in the kernel's text format; `bdis` are the backend names.
    pub fn render(&self, bdis: &[String]) -> String {
        let bdi = |b: &BackendId| bdis.get(b.index()).map_or("?", |s| s.as_str()).to_string();
        match self {
            TraceEvent::BalanceDirtyPages {
                bdi: b,
                limit,
                setpoint,
                dirty,
                bdi_setpoint,
                bdi_dirty,
                dirty_ratelimit_kbps,
                task_ratelimit_kbps,
                dirtied,
                dirtied_pause,
                paused_ms,
                pause_ms,
                period_ms,
                think_ms,
                ..
            } => format!(
                "balance_dirty_pages: bdi={} limit={limit} setpoint={setpoint} dirty={dirty} bdi_setpoint={bdi_setpoint} \
                 bdi_dirty={bdi_dirty} dirty_ratelimit={dirty_ratelimit_kbps} task_ratelimit={task_ratelimit_kbps} \
                 dirtied={dirtied} dirtied_pause={dirtied_pause} paused={paused_ms} pause={pause_ms} period={period_ms} \
                 think={think_ms} cgroup_ino=1",
                bdi(b)
            ),
            TraceEvent::LegacyBalanceDirtyPages {
                bdi: b,
                write_chunk,
                pages_written,
                pause_ms,
                ..
            } => format!(
                "balance_dirty_pages: bdi={} write_chunk={write_chunk} pages_written={pages_written} pause={pause_ms}",
                bdi(b)
            ),
            TraceEvent::Writepages { bdi: b, inode, wrote } => {
                format!("writeback_single_inode: bdi={} ino={} wrote={wrote}", bdi(b), inode.0)
            }
            TraceEvent::Commit { bdi: b, inode, pages } => format!(
                "nfs_initiate_commit: bdi={} fileid={} offset=0 count={}",
                bdi(b),
                inode.0,
                pages * crate::config::PAGE_SIZE
            ),
            TraceEvent::Bw2010BalanceDirtyPages {
                bdi: b,
                weight_pct,
                thresh,
                gap,
                dirtied,
                pause_ms,
                bw,
                ..
            } => format!(
                "balance_dirty_pages: bdi={} weight={weight_pct}% thresh={thresh} gap={gap} dirtied={dirtied} pause={pause_ms} bw={bw}",
                bdi(b)
            ),
            TraceEvent::BdiDirtyRatelimit {
                bdi: b,
                write_bw_kbps,
                avg_write_bw_kbps,
                dirty_rate_kbps,
                dirty_ratelimit_kbps,
                task_ratelimit_kbps,
                balanced_dirty_ratelimit_kbps,
            } => format!(
                "bdi_dirty_ratelimit: bdi={} write_bw={write_bw_kbps} awrite_bw={avg_write_bw_kbps} dirty_rate={dirty_rate_kbps} \
                 dirty_ratelimit={dirty_ratelimit_kbps} task_ratelimit={task_ratelimit_kbps} \
                 balanced_dirty_ratelimit={balanced_dirty_ratelimit_kbps} cgroup_ino=1",
                bdi(b)
            ),
            TraceEvent::WritebackStart { bdi: b, nr_pages, reason, sync_all } => format!(
                "writeback_start: bdi {}: sb_dev 0:0 nr_pages={} sync_mode={} kupdate={} range_cyclic={} background={} reason={reason} cgroup_ino=1",
                bdi(b),
                if *nr_pages == u64::MAX { i64::MAX } else { *nr_pages as i64 },
                u8::from(*sync_all),
                u8::from(*reason == "periodic"),
                u8::from(!*sync_all),
                u8::from(*reason == "background"),
            ),
            TraceEvent::WritebackWritten { bdi: b, written, reason } => {
                format!(
                    "writeback_written: bdi {}: written={written} reason={reason} cgroup_ino=1",
                    bdi(b)
                )
            }
            TraceEvent::Wbt { bdi: b, eval: e, inflight } => wbt_lines(&bdi(b), e, *inflight),
            TraceEvent::GlobalDirtyState {
                dirty,
                writeback,
                unstable,
                bg_thresh,
                thresh,
                limit,
                dirtied,
                written,
            } => format!(
                "global_dirty_state: dirty={dirty} writeback={writeback} unstable={unstable} \
                 bg_thresh={bg_thresh} thresh={thresh} limit={limit} dirtied={dirtied} \
                 written={written}"
            ),
            TraceEvent::QueueIo { bdi: b, moved, reason } => {
                format!(
                    "writeback_queue_io: bdi {}: moved={moved} reason={reason} cgroup_ino=1",
                    bdi(b)
                )
            }
        }
    }
}

/// The `wbt_stat`, `wbt_step` (when the limits were scaled) and `wbt_timer` lines of one wbt
/// window's evaluation on backend `name`.
fn wbt_lines(name: &str, e: &crate::wbt::Evaluation, inflight: u32) -> String {
    let mut line = format!(
        "wbt_stat: {}: rmean={}, rmin={}, rmax={}, rsamples={}, wmean={}, wsamples={}",
        name, e.read_mean_ns, e.read_min_ns, e.read_max_ns, e.reads, e.write_mean_ns, e.writes
    );
    if e.scaled {
        line.push_str(&format!(
            "\nwbt_step: {}: step={}, window={}, background={}, normal={}, max={}",
            name,
            e.step,
            e.window_ns / 1000,
            e.wb_background,
            e.wb_normal,
            e.max_depth
        ));
        if let Some(pages) = e.write_pages {
            line.push_str(&format!(", write_pages={pages}"));
        }
        if let Some(duty) = e.duty_permille {
            line.push_str(&format!(", duty={duty}"));
        }
    }
    line.push_str(&format!(
        "\nwbt_timer: {}: status={}, step={}, inflight={}",
        name,
        e.status.code(),
        e.step,
        inflight
    ));
    line
}
