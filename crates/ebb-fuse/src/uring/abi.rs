//! The kernel's FUSE-over-io_uring interface: the layouts and numbers of `linux/fuse.h`
//! (protocol 7.42) that a server uses, mirrored as plain structures, and where each field sits.
//!
//! A ring entry's header buffer is a `fuse_uring_req_header`: 128 bytes for the
//! `fuse_in_header` of a request (or the `fuse_out_header` of its answer), 128 bytes for the
//! request kind's own header, then a `fuse_uring_ent_in_out`. The command area (80 bytes) of a
//! 128-byte submission entry holds a `fuse_uring_cmd_req`.

/// `IORING_OP_URING_CMD` command: give the kernel a ring entry's buffers (two iovecs: header,
/// payload) and wait for a request.
pub(crate) const CMD_REGISTER: u32 = 1;
/// `IORING_OP_URING_CMD` command: answer the request of `commit_id` and wait for the next.
pub(crate) const CMD_COMMIT_AND_FETCH: u32 = 2;

/// Bytes of the header buffer's first part (`fuse_in_header`, 40 bytes, or
/// `fuse_out_header`, 16).
pub(crate) const IN_OUT_SIZE: usize = 128;
/// Bytes of the header buffer's second part, the request kind's own header.
pub(crate) const OP_IN_SIZE: usize = 128;
/// `sizeof(struct fuse_in_header)`.
pub(crate) const IN_HEADER_SIZE: usize = 40;
/// `sizeof(struct fuse_out_header)`.
pub(crate) const OUT_HEADER_SIZE: usize = 16;
/// The kernel's smallest payload buffer (`FUSE_MIN_READ_BUFFER`); it asks for at least the
/// larger of this, `max_write` and `max_pages` pages.
pub(crate) const MIN_PAYLOAD: usize = 8192;

/// `struct fuse_uring_ent_in_out`: what the kernel says about the request in an entry, and
/// the server about its answer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EntInOut {
    pub(crate) flags: u64,
    /// The request's `unique`, given back with the answer.
    pub(crate) commit_id: u64,
    /// Bytes in the payload buffer (the request's, then the answer's).
    pub(crate) payload_sz: u32,
    pub(crate) padding: u32,
    pub(crate) reserved: u64,
}

/// `struct fuse_uring_req_header`: a ring entry's header buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReqHeader {
    pub(crate) in_out: [u8; IN_OUT_SIZE],
    pub(crate) op_in: [u8; OP_IN_SIZE],
    pub(crate) ent: EntInOut,
}

impl Default for ReqHeader {
    fn default() -> ReqHeader {
        ReqHeader { in_out: [0; IN_OUT_SIZE], op_in: [0; OP_IN_SIZE], ent: EntInOut::default() }
    }
}

const _: () = assert!(size_of::<EntInOut>() == 32);
const _: () = assert!(size_of::<ReqHeader>() == 288);

/// `struct fuse_uring_cmd_req` (flags 0, the request answered, the queue), as the 80 bytes of
/// a submission entry's command area.
pub(crate) fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    // flags: bytes 0..8, zero.
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

/// What a request's `fuse_in_header` says that the ring needs: its whole length (headers and
/// payload, as `read(2)` of `/dev/fuse` would give it) and its `unique`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InHeader {
    pub(crate) len: u32,
    pub(crate) opcode: u32,
    pub(crate) unique: u64,
}

impl InHeader {
    /// From the first bytes of a header buffer.
    pub(crate) fn parse(in_out: &[u8; IN_OUT_SIZE]) -> InHeader {
        let u32_at = |at: usize| {
            u32::from_ne_bytes([in_out[at], in_out[at + 1], in_out[at + 2], in_out[at + 3]])
        };
        let mut unique = [0u8; 8];
        unique.copy_from_slice(&in_out[8..16]);
        InHeader { len: u32_at(0), opcode: u32_at(4), unique: u64::from_ne_bytes(unique) }
    }
}

/// Where the request of an entry goes in a contiguous buffer, as `read(2)` of `/dev/fuse`
/// gives it: `fuse_in_header`, the kind's header (`op_len` bytes of `op_in`), the payload.
/// `None` if the lengths do not add up (a request ebb cannot decode).
pub(crate) fn op_header_len(header: &InHeader, payload_sz: u32) -> Option<usize> {
    let rest = (header.len as usize).checked_sub(IN_HEADER_SIZE + payload_sz as usize)?;
    (rest <= OP_IN_SIZE).then_some(rest)
}

/// A `fuse_out_header` answering `unique` with `-errno` and no body.
pub(crate) fn error_answer(unique: u64, errno: i32) -> [u8; OUT_HEADER_SIZE] {
    let mut out = [0u8; OUT_HEADER_SIZE];
    out[0..4].copy_from_slice(&(OUT_HEADER_SIZE as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    out[8..16].copy_from_slice(&unique.to_ne_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_splits_into_headers_and_payload() {
        let mut in_out = [0u8; IN_OUT_SIZE];
        in_out[0..4].copy_from_slice(&(40u32 + 40 + 4096).to_ne_bytes());
        in_out[4..8].copy_from_slice(&16u32.to_ne_bytes());
        in_out[8..16].copy_from_slice(&77u64.to_ne_bytes());
        let header = InHeader::parse(&in_out);
        assert_eq!(header, InHeader { len: 4176, opcode: 16, unique: 77 });
        // A WRITE: 40 bytes of fuse_write_in, 4096 of data.
        assert_eq!(op_header_len(&header, 4096), Some(40));
        // Lengths that do not add up.
        assert_eq!(op_header_len(&header, 8192), None);
        let long = InHeader { len: 40 + 129, ..header };
        assert_eq!(op_header_len(&long, 0), None);
    }

    #[test]
    fn the_command_area_holds_commit_id_and_queue() {
        let cmd = cmd_req(0x0102_0304_0506_0708, 3);
        assert_eq!(&cmd[0..8], &[0; 8]);
        assert_eq!(u64::from_ne_bytes(cmd[8..16].try_into().unwrap()), 0x0102_0304_0506_0708);
        assert_eq!(u16::from_ne_bytes(cmd[16..18].try_into().unwrap()), 3);
        assert!(cmd[18..].iter().all(|byte| *byte == 0));
    }
}
