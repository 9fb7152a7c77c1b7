//! The webhook's serving certificate, kept current without a restart.
//!
//! `--tls-cert-file`/`--tls-key-file` (e.g. cert-manager's Secret, mounted) win, with
//! `caBundle` from `--tls-ca-file`; cert-manager renews them in place, so the operator reads
//! them again every `--tls-reload-seconds` and serves what changed. Without them, the operator
//! makes a CA and a serving certificate and keeps them in a Secret of its namespace
//! (`--webhook-tls-secret`), so that every replica serves the same one; every replica reads it again as
//! often, and whichever finds it near its end, or made for other names, makes it again (a
//! replace guarded by the Secret's resourceVersion, so one replica wins). A new serving
//! certificate is signed by the same CA, whose key the Secret keeps, so `caBundle` stays valid;
//! when the CA itself nears its end, a new one is made and `ca.crt` holds both, the new first,
//! so that replicas still serving the old certificate remain trusted until they reload.
//!
//! Every change of the CA goes to [`keep_current`]'s channel, which the webhook configuration
//! follows.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
use time::OffsetDateTime;
use tracing::{info, warn};

use super::args::WebhookArgs;
use crate::operator::owner;

/// A self-made serving certificate's lifetime, and how long before its end it is made again.
const LEAF_DAYS: i64 = 365;
const LEAF_RENEW_DAYS: i64 = 30;
/// The self-made CA's lifetime, and how long before its end a new one replaces it.
const CA_DAYS: i64 = 3650;
const CA_RENEW_DAYS: i64 = 365;

/// PEM-encoded serving material.
#[derive(Clone, PartialEq)]
pub struct Tls {
    /// Certificate chain.
    pub cert: String,
    /// Private key.
    pub key: String,
    /// The CA bundle for caBundle, when known.
    pub ca: Option<String>,
}

/// Where the serving certificate comes from.
pub enum Source {
    /// Files, e.g. cert-manager's Secret mounted into the pod.
    Files {
        /// The certificate chain.
        cert: PathBuf,
        /// Its key.
        key: PathBuf,
        /// The CA that signed it, if given.
        ca: Option<PathBuf>,
    },
    /// Made by the operator and kept in a Secret of its namespace (`--webhook-tls-secret`).
    SelfMade {
        /// The Secrets of the operator's namespace (boxed: far larger than the paths).
        secrets: Box<Api<Secret>>,
        /// The Secret's name.
        name: String,
        /// The names the certificate must carry.
        hosts: Vec<String>,
        /// The owner of the Secret (see `owner`).
        owner: Option<OwnerReference>,
    },
}

impl Source {
    /// The files of `args`, else the self-made certificate for the webhook's names.
    pub fn new(
        client: &kube::Client,
        args: &WebhookArgs,
        namespace: &str,
        owner: Option<OwnerReference>,
    ) -> Self {
        if let (Some(cert), Some(key)) = (&args.tls_cert_file, &args.tls_key_file) {
            return Source::Files {
                cert: cert.clone(),
                key: key.clone(),
                ca: args.tls_ca_file.clone(),
            };
        }
        Source::SelfMade {
            secrets: Box::new(Api::namespaced(client.clone(), namespace)),
            name: args.webhook_tls_secret.clone(),
            hosts: hosts(args, namespace),
            owner,
        }
    }

    /// The certificate to serve now: the files' content, or the Secret's (made, or made again
    /// when missing, near its end or for other names).
    pub async fn load(&self) -> anyhow::Result<Tls> {
        match self {
            Source::Files { cert, key, ca } => {
                let read = |p: &PathBuf| {
                    std::fs::read_to_string(p)
                        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
                };
                Ok(Tls {
                    cert: read(cert)?,
                    key: read(key)?,
                    ca: ca.as_ref().map(read).transpose()?,
                })
            }
            Source::SelfMade {
                secrets,
                name,
                hosts,
                owner,
            } => self_made(secrets, name, hosts, owner.as_ref()).await,
        }
    }
}

/// Every `period`, loads the certificate again; when it changed, serves it and sends its CA
/// bundle to `ca`.
pub async fn keep_current(
    source: Source,
    mut current: Tls,
    server: axum_server::tls_rustls::RustlsConfig,
    ca: tokio::sync::watch::Sender<Option<String>>,
    period: Duration,
) {
    loop {
        tokio::time::sleep(period).await;
        let fresh = match source.load().await {
            Ok(fresh) if fresh != current => fresh,
            Ok(_) => continue,
            Err(e) => {
                warn!(error = %e, "could not load the webhook's certificate; serving the previous one");
                continue;
            }
        };
        let reloaded = server
            .reload_from_pem(fresh.cert.clone().into_bytes(), fresh.key.clone().into_bytes())
            .await;
        if let Err(e) = reloaded {
            warn!(error = %e, "the webhook's new certificate is unusable; serving the previous one");
            continue;
        }
        info!("serving the webhook's renewed certificate");
        ca.send_replace(fresh.ca.clone());
        current = fresh;
    }
}

/// The Secret's certificate, made (again) when it is missing or not [`fresh`].
async fn self_made(
    secrets: &Api<Secret>,
    name: &str,
    hosts: &[String],
    owner: Option<&OwnerReference>,
) -> anyhow::Result<Tls> {
    let found = secrets.get_opt(name).await?;
    if let Some(found) = &found {
        if let Some(owner) = owner.filter(|_| found.metadata.owner_references.is_none()) {
            owner::adopt(secrets, name, owner).await?;
        }
        if let Some(tls) = from_secret(found).filter(|t| fresh(&t.cert, hosts)) {
            return Ok(tls);
        }
    }
    let old = |key: &str| found.as_ref().and_then(|s| field(s, key));
    let (tls, ca_key) = make(hosts, old("ca.crt"), old("ca.key"))?;
    let mut secret = to_secret(name, &tls, &ca_key, owner);
    let written = match found {
        None => secrets.create(&PostParams::default(), &secret).await,
        Some(old) => {
            secret.metadata.resource_version = old.metadata.resource_version;
            secrets.replace(name, &PostParams::default(), &secret).await
        }
    };
    match written {
        Ok(_) => {
            info!(secret = name, ?hosts, "made the webhook's serving certificate");
            Ok(tls)
        }
        // Another replica was first: use its certificate.
        Err(kube::Error::Api(e)) if e.code == 409 => from_secret(&secrets.get(name).await?)
            .ok_or_else(|| anyhow::anyhow!("Secret {name} lacks tls.crt, tls.key or ca.crt")),
        Err(e) => Err(e.into()),
    }
}

fn field(s: &Secret, key: &str) -> Option<String> {
    let value = s.data.as_ref()?.get(key)?;
    Some(String::from_utf8_lossy(&value.0).into_owned())
}

fn from_secret(s: &Secret) -> Option<Tls> {
    Some(Tls {
        cert: field(s, "tls.crt")?,
        key: field(s, "tls.key")?,
        ca: Some(field(s, "ca.crt")?),
    })
}

fn to_secret(name: &str, tls: &Tls, ca_key: &str, owner: Option<&OwnerReference>) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let data = BTreeMap::from([
        ("tls.crt".to_string(), bytes(&tls.cert)),
        ("tls.key".to_string(), bytes(&tls.key)),
        ("ca.crt".to_string(), bytes(tls.ca.as_deref().unwrap_or_default())),
        ("ca.key".to_string(), bytes(ca_key)),
    ]);
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            owner_references: owner.map(|o| vec![o.clone()]),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// `f` of the first certificate in `pem`, if it parses.
fn parsed<T>(pem: &str, f: impl FnOnce(&x509_parser::certificate::X509Certificate) -> T) -> Option<T> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    Some(f(&cert))
}

/// Whether the first certificate of `pem` lasts longer than `days` from now.
fn lasts(pem: &str, days: i64) -> bool {
    let end = parsed(pem, |c| c.validity().not_after.timestamp());
    let horizon = OffsetDateTime::now_utc() + time::Duration::days(days);
    end.is_some_and(|end| end > horizon.unix_timestamp())
}

/// Whether the serving certificate `pem` is for exactly `hosts` and not near its end.
fn fresh(pem: &str, hosts: &[String]) -> bool {
    let names = parsed(pem, |c| match c.subject_alternative_name() {
        Ok(Some(ext)) => ext.value.general_names.iter().filter_map(name).collect(),
        _ => BTreeSet::new(),
    });
    names == Some(hosts.iter().cloned().collect()) && lasts(pem, LEAF_RENEW_DAYS)
}

/// A DNS name or IP address of a certificate, as written in a URL.
fn name(general: &x509_parser::extensions::GeneralName) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    match general {
        GeneralName::DNSName(dns) => Some(dns.to_string()),
        GeneralName::IPAddress(ip) => match ip.len() {
            4 => Some(std::net::IpAddr::from(<[u8; 4]>::try_from(*ip).ok()?).to_string()),
            16 => Some(std::net::IpAddr::from(<[u8; 16]>::try_from(*ip).ok()?).to_string()),
            _ => None,
        },
        _ => None,
    }
}

/// The names the serving certificate must carry.
fn hosts(args: &WebhookArgs, namespace: &str) -> Vec<String> {
    if let Some(url) = &args.webhook_url {
        let host = url
            .trim_start_matches("https://")
            .split(['/', ':'])
            .next()
            .unwrap_or_default();
        return vec![host.to_string()];
    }
    let svc = &args.webhook_service;
    vec![
        format!("{svc}.{namespace}.svc"),
        format!("{svc}.{namespace}.svc.cluster.local"),
    ]
}

/// The first certificate of a PEM bundle.
fn first_cert(bundle: &str) -> Option<String> {
    let first = bundle.split_inclusive("-----END CERTIFICATE-----").next()?;
    first
        .contains("-----BEGIN CERTIFICATE-----")
        .then(|| first.trim().to_string())
}

/// A serving certificate for `hosts`, signed by the CA of `bundle` (current CA first) and
/// `ca_key` while that CA lasts, else by a new CA trusted next to it. Returns the material and
/// the CA's key.
fn make(hosts: &[String], bundle: Option<String>, ca_key: Option<String>) -> anyhow::Result<(Tls, String)> {
    let reusable = |bundle: &str, key: &str| {
        let first = first_cert(bundle)?;
        let issuer = Issuer::from_ca_cert_pem(&first, KeyPair::from_pem(key).ok()?).ok()?;
        lasts(&first, CA_RENEW_DAYS).then_some(issuer)
    };
    let current = match (&bundle, &ca_key) {
        (Some(bundle), Some(key)) => reusable(bundle, key),
        _ => None,
    };
    let (issuer, bundle, ca_key) = match (current, bundle, ca_key) {
        (Some(issuer), Some(bundle), Some(key)) => (issuer, bundle, key),
        (_, bundle, _) => new_ca(bundle, CA_DAYS)?,
    };
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, hosts[0].clone());
    (params.not_before, params.not_after) = validity(LEAF_DAYS);
    let cert = params.signed_by(&key, &issuer)?;
    let tls = Tls {
        cert: cert.pem(),
        key: key.serialize_pem(),
        ca: Some(bundle),
    };
    Ok((tls, ca_key))
}

/// A new CA valid for `days`: its issuer, the bundle (it, then the first certificate of `old`
/// if that is still valid) and its key.
fn new_ca(old: Option<String>, days: i64) -> anyhow::Result<(Issuer<'static, KeyPair>, String, String)> {
    let ca_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "podlock webhook CA");
    (params.not_before, params.not_after) = validity(days);
    let pem = params.self_signed(&ca_key)?.pem();
    let old_first = old
        .as_deref()
        .and_then(first_cert)
        .filter(|first| lasts(first, 0));
    let bundle = match old_first {
        Some(old) => format!("{}\n{old}\n", pem.trim()),
        None => pem,
    };
    let key_pem = ca_key.serialize_pem();
    Ok((Issuer::new(params, ca_key), bundle, key_pem))
}

/// From an hour ago (clocks differ) to `days` from now.
fn validity(days: i64) -> (OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::now_utc();
    (now - time::Duration::hours(1), now + time::Duration::days(days))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<String> {
        vec!["podlock-webhook.podlock.svc".into()]
    }

    #[test]
    fn a_new_certificate_is_fresh_for_its_names_only() {
        let (tls, _) = make(&hosts(), None, None).unwrap();
        assert!(fresh(&tls.cert, &hosts()));
        assert!(!fresh(&tls.cert, &["other.podlock.svc".to_string()]));
    }

    #[test]
    fn a_renewed_certificate_keeps_the_ca_while_it_lasts() {
        let (first, ca_key) = make(&hosts(), None, None).unwrap();
        let (second, key_again) = make(&hosts(), first.ca.clone(), Some(ca_key.clone())).unwrap();
        assert_eq!((second.ca, key_again), (first.ca, ca_key));
        assert_ne!(second.cert, first.cert);
    }

    #[test]
    fn a_ca_near_its_end_is_replaced_and_trusted_next_to_the_new_one() {
        let (_, old_bundle, old_key) = new_ca(None, CA_RENEW_DAYS - 1).unwrap();
        let (renewed, new_key) = make(&hosts(), Some(old_bundle.clone()), Some(old_key.clone())).unwrap();
        let bundle = renewed.ca.unwrap();
        assert_ne!(new_key, old_key);
        assert!(!bundle.starts_with(old_bundle.trim()), "the new CA comes first");
        assert!(bundle.contains(old_bundle.trim()), "the old CA stays trusted");
        assert!(lasts(&bundle, CA_DAYS - 2), "{bundle}");
    }

    #[test]
    fn a_ca_without_its_key_is_replaced_and_trusted_next_to_the_new_one() {
        let (_, old_bundle, _) = new_ca(None, CA_DAYS).unwrap();
        let (renewed, _) = make(&hosts(), Some(old_bundle.clone()), None).unwrap();
        let bundle = renewed.ca.unwrap();
        assert!(!bundle.starts_with(old_bundle.trim()) && bundle.contains(old_bundle.trim()));
    }
}
