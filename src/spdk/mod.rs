//! Typed params and results of every SPDK and SNAP-4 JSON-RPC method the
//! project calls, in one place (see `docs`/the reference captures for the wire
//! shapes). Each params struct implements [`Method`]; pass it to
//! [`RpcClient::call`](crate::jsonrpc::RpcClient::call).
//!
//! Optional params are skipped when `None`, as SPDK's own rpc.py does.
//! Results decode leniently: fields we do not use are ignored, so newer SPDK
//! and SNAP versions that add fields keep working.

pub mod accel;
pub mod app;
pub mod bdev;
pub mod fsdev;
pub mod lvol;
pub mod nvme;
pub mod nvmf;
pub mod snap;

/// Implements [`Method`](crate::jsonrpc::Method) for a params type.
macro_rules! method {
    ($params:ty => $name:literal, $output:ty) => {
        impl $crate::jsonrpc::Method for $params {
            const NAME: &'static str = $name;
            type Output = $output;
        }
    };
}
pub(crate) use method;
