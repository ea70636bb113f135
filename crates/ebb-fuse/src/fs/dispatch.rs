//! Where a request runs: on its request loop when it cannot wait for a server, else on the
//! guard's pool, killable and tried again through an outage ([`super::outage`]).

use std::sync::Arc;

use ebb_backend::Namespace;
use fuser::{Errno, FileAttr, ReplyEntry, Request};

use super::convert::reply_entry;
use super::outage::Reply;
use super::{EbbFs, Inner, io_ops};

impl<N: Namespace> EbbFs<N> {
    /// Runs `op` for the caller of `req`, then `answer`s: with the reply, or `None` if the
    /// caller was killed meanwhile (then `answer` undoes what the result holds). On a local
    /// directory, on this request loop when it may serve one ([`io_ops::Inline`]): the
    /// namespace's calls wait for the disk, never for a server, so there is no outage to wait
    /// through and no caller to answer `EINTR` (a hand-off costs a thread's wake-up and two
    /// context switches per request: docs/fuse-requests.md). Otherwise, and for an outage
    /// error on the loop, on the guard's pool, tried again through an outage until the
    /// deadline ([`outage`]).
    pub(super) fn guarded<R: Reply, T: Send + 'static>(
        &self,
        req: &Request,
        reply: R,
        op: impl Fn(&Inner<N>) -> Result<T, Errno> + Send + 'static,
        answer: impl FnOnce(&Inner<N>, Option<R>, Result<T, Errno>) + Send + 'static,
    ) {
        if self.local
            && let Some(turn) = io_ops::Inline::take(&self.inline)
        {
            let result = self.guard.clock.once(|| op(&self.inner));
            // Given back before the answer, which wakes the caller: its next request, read by
            // the other loop at once, would find the turn taken and go to the pool.
            drop(turn);
            if let Some(result) = result {
                self.inner.files.counts.meta_on_loop();
                answer(&self.inner, Some(reply), result);
                return;
            }
        }
        self.on_guard_pool(req, reply, op, answer);
    }

    /// [`EbbFs::guarded`] always on the guard's pool: for a request that may wait long even
    /// on a local directory (an `fsyncdir` waits for the disk's journal).
    pub(super) fn on_guard_pool<R: Reply, T: Send + 'static>(
        &self,
        req: &Request,
        reply: R,
        op: impl Fn(&Inner<N>) -> Result<T, Errno> + Send + 'static,
        answer: impl FnOnce(&Inner<N>, Option<R>, Result<T, Errno>) + Send + 'static,
    ) {
        let (inner, clock) = (Arc::clone(&self.inner), Arc::clone(&self.guard.clock));
        self.guard.run(
            req.pid(),
            reply,
            move |interrupted| {
                let result = clock.through_outage(interrupted, || op(&inner));
                (inner, result)
            },
            move |reply, (inner, result)| answer(&inner, reply, result),
        );
    }

    /// [`EbbFs::guarded`] for a request whose result holds nothing to undo.
    pub(super) fn simple<R: Reply, T: Send + 'static>(
        &self,
        req: &Request,
        reply: R,
        op: impl Fn(&Inner<N>) -> Result<T, Errno> + Send + 'static,
        answer: impl FnOnce(R, Result<T, Errno>) + Send + 'static,
    ) {
        self.guarded(req, reply, op, move |_, reply, result| {
            if let Some(reply) = reply {
                answer(reply, result);
            }
        });
    }

    /// [`EbbFs::guarded`] for a request that counts a kernel reference on a node (forgotten
    /// again if the caller was killed).
    pub(super) fn entry(
        &self,
        req: &Request,
        reply: ReplyEntry,
        op: impl Fn(&Inner<N>) -> Result<(FileAttr, u64), Errno> + Send + 'static,
    ) {
        self.guarded(req, reply, op, |inner, reply, result| match (reply, result) {
            (Some(reply), result) => reply_entry(reply, result),
            (None, Ok((attr, _))) => inner.nodes.forget(attr.ino.0, 1),
            (None, Err(_)) => {}
        });
    }
}
