//! The operator's release notices, kept subscribed for as long as the
//! controller listens.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::store::{StoreError, Target};

/// Release notifications (Valkey's pub/sub channel, or a watch of etcd's
/// lease records), subscribed when the controller starts (lazily, so a
/// replica that never leads holds no subscription). A subscription that
/// cannot be made (the store down when leadership started) or that ends is
/// retried with capped backoff for as long as the controller polls the
/// stream; it stops when the controller does. Releases published while
/// unsubscribed are missed: waiters also re-check on their own.
pub fn resubscribing<F, Fut>(subscribe: F) -> BoxStream<'static, Target>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<BoxStream<'static, Target>, StoreError>> + Send,
{
    let first = Duration::from_millis(200);
    futures::stream::unfold((subscribe, first), move |(subscribe, mut delay)| async move {
        loop {
            match subscribe().await {
                Ok(stream) => {
                    tracing::info!("subscribed to release notifications");
                    // When the subscriber closes, pause and subscribe again.
                    let ended = futures::stream::once(async {
                        tracing::warn!("release notifications ended; subscribing again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    })
                    .filter_map(|()| async { None });
                    return Some((stream.chain(ended).boxed(), (subscribe, first)));
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    retry_in = ?delay,
                    "no release notifications yet; waiters retry at the holder's expiry meanwhile"
                ),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    })
    .flatten()
    .boxed()
}
