//! Azure Blob Storage (`az://container/prefix`): an [`ObjectsStore`] over object_store's Azure
//! client. What Azure alone does: a large upload is blocks committed by one block list (through
//! object_store's writer, so attributes such as the blake3 land with the commit); blocks never
//! committed have no upload id to list or abort and expire by themselves after a week, so gc
//! has nothing to do for them. Credentials: the account's shared key (given, from a file, or
//! `AZURE_STORAGE_ACCOUNT_KEY`), else what the environment offers (workload or managed
//! identity, the Azure CLI).

use std::sync::Arc;

use object_store::azure::MicrosoftAzureBuilder;

use crate::error::{Error, Result};
use crate::objects::{ObjectsStore, Service, Transport, bucket_and_prefix};
use crate::options::StoreOptions;

/// What Azure adds to [`ObjectsStore`]: nothing but its name.
#[derive(Debug)]
struct Azure;

/// The store for an `az://container/prefix` URL.
pub(crate) fn open(url: &str, opts: &StoreOptions) -> Result<ObjectsStore> {
    let cfg_err = |message: String| Error::Config { file: url.to_string(), message };
    let (container, prefix) = bucket_and_prefix(url, "az://container/prefix")?;
    let a = &opts.azure;
    let transport = Transport { limits: a.limits(), read_stall: opts.read_stall.0 };
    let mut b = MicrosoftAzureBuilder::from_env().with_container_name(container);
    if let Some(account) = &a.account {
        b = b.with_account(account);
    }
    if let Some(key) = &a.access_key {
        b = b.with_access_key(key);
    }
    if let Some(endpoint) = &a.endpoint {
        b = b.with_endpoint(endpoint.trim_end_matches('/').to_string());
    }
    let co = transport.client_options("store.azure").map_err(&cfg_err)?;
    let store = b
        .with_allow_http(a.allow_http)
        .with_client_options(co)
        .with_retry(transport.retry())
        .build()
        .map_err(|e| cfg_err(format!("cannot set up the Azure client: {e}")))?;
    Ok(ObjectsStore::new(Arc::new(store), None, Arc::new(Azure), container, prefix, transport))
}

#[async_trait::async_trait]
impl Service for Azure {
    fn name(&self) -> &'static str {
        "Azure"
    }

    fn scheme(&self) -> &'static str {
        "az"
    }

    fn uploads_unlisted(&self) -> Option<&'static str> {
        Some("Azure keeps uncommitted blocks without an upload to list (they expire after a week)")
    }
}
