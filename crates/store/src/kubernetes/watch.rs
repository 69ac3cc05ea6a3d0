//! A watch that outlives the API server's watch requests.
//!
//! The API server ends every watch request after `timeoutSeconds` (kube-rs asks for 290 s) or
//! when a load balancer drops the connection, with no error. The [`Store`](crate::Store)
//! contract is that a watch stream ends only with an error or at shutdown, so this stream
//! re-issues the request from the last resourceVersion it delivered (an object's, or a
//! bookmark's) and the caller sees one uninterrupted stream.
//!
//! # Expected flow
//!
//! 1. [`start`] sends the first request; an immediate failure (410 for an expired version, 404
//!    for an unserved kind) is returned by `watch` itself.
//! 2. Each `ADDED`/`MODIFIED`/`DELETED`/`BOOKMARK` line is yielded, and its resourceVersion
//!    becomes the resume point.
//! 3. When the response body ends, the request is sent again from the resume point. When the
//!    session that just ended delivered nothing at all, it waits [`EMPTY_SESSION_PAUSE`] first,
//!    so a server or proxy that closes watches at once is not hammered.
//! 4. An `ERROR` line, a failed request or a broken body is yielded as the stream's last item:
//!    410 becomes [`StoreError::Gone`](crate::StoreError::Gone) (relist), anything else its
//!    mapped error.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use kube::api::{Api, WatchParams};
use kube::core::WatchEvent as KubeEvent;

use super::errors::Target;
use crate::{Object, Result, StoreError, WatchEvent, WatchStream};

/// How long to wait before re-sending a watch whose previous session delivered no line at all.
pub(super) const EMPTY_SESSION_PAUSE: Duration = Duration::from_secs(1);

/// The events of one watch request.
type Session<K> = BoxStream<'static, kube::Result<KubeEvent<K>>>;

/// Everything needed to resume the watch.
struct Resume<K: Object> {
    api: Api<K>,
    params: WatchParams,
    /// The last resourceVersion delivered to the caller; the next request starts after it.
    resource_version: String,
    target: Target,
    /// The open request, or `None` between requests.
    session: Option<Session<K>>,
    /// Whether the open (or last) request delivered any line.
    delivered: bool,
}

/// Opens a watch from just after `resource_version` (which must not be empty).
pub(super) async fn start<K: Object>(
    api: Api<K>,
    params: WatchParams,
    resource_version: String,
    target: Target,
) -> Result<WatchStream<K>> {
    let session = open(&api, &params, &resource_version, &target).await?;
    let state =
        Resume { api, params, resource_version, target, session: Some(session), delivered: false };
    Ok(stream::unfold(Some(state), next).boxed())
}

/// Sends one watch request.
async fn open<K: Object>(
    api: &Api<K>,
    params: &WatchParams,
    resource_version: &str,
    target: &Target,
) -> Result<Session<K>> {
    tracing::debug!(kind = %K::kind(&()), resource_version, "opening watch");
    match api.watch(params, resource_version).await {
        Ok(events) => Ok(events.boxed()),
        Err(e) => Err(target.clone().at_version(resource_version).error(e)),
    }
}

/// The unfold step: the next item, and the state to continue from (`None` after an error).
async fn next<K: Object>(
    state: Option<Resume<K>>,
) -> Option<(Result<WatchEvent<K>>, Option<Resume<K>>)> {
    let mut st = state?;
    loop {
        let Some(session) = st.session.as_mut() else {
            if !st.delivered {
                tokio::time::sleep(EMPTY_SESSION_PAUSE).await;
            }
            match open(&st.api, &st.params, &st.resource_version, &st.target).await {
                Ok(session) => {
                    st.session = Some(session);
                    st.delivered = false;
                    continue;
                }
                Err(e) => return Some((Err(e), None)),
            }
        };
        let event = match session.next().await {
            None => {
                tracing::debug!(
                    kind = %K::kind(&()),
                    resource_version = st.resource_version,
                    "watch request ended; resuming"
                );
                st.session = None;
                continue;
            }
            Some(Err(e)) => return Some((Err(st.fail(e)), None)),
            Some(Ok(event)) => event,
        };
        st.delivered = true;
        let event = match event {
            KubeEvent::Added(obj) => WatchEvent::Added(st.advance(obj)),
            KubeEvent::Modified(obj) => WatchEvent::Modified(st.advance(obj)),
            KubeEvent::Deleted(obj) => WatchEvent::Deleted(st.advance(obj)),
            KubeEvent::Bookmark(bookmark) => {
                st.resource_version = bookmark.metadata.resource_version;
                WatchEvent::Bookmark(st.resource_version.clone())
            }
            KubeEvent::Error(status) => {
                let err = st.target.clone().at_version(&st.resource_version).status(&status);
                return Some((Err(err), None));
            }
        };
        return Some((Ok(event), Some(st)));
    }
}

impl<K: Object> Resume<K> {
    /// Moves the resume point to `obj`'s resourceVersion.
    fn advance(&mut self, obj: K) -> Arc<K> {
        if let Some(rv) = obj.meta().resource_version.as_deref().filter(|rv| !rv.is_empty()) {
            rv.clone_into(&mut self.resource_version);
        }
        Arc::new(obj)
    }

    /// Maps an error of the open request.
    fn fail(&self, err: kube::Error) -> StoreError {
        self.target.clone().at_version(&self.resource_version).error(err)
    }
}
