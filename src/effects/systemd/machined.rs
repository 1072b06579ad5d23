//! login1 (`reboot`) and machine1 (the nspawn machines machined knows), on the manager's
//! connection.

use super::{
    DbusSystemd, MACHINE_POLL, NO_SUCH_MACHINE, SERVICE_UNKNOWN, UNKNOWN_OBJECT, bus_failed,
    is_error, usec_to_timestamp,
};
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::Timestamp;
use zbus::OwnedObjectPath;
use zbus::proxy::CacheProperties;
use zbus_systemd::login1::ManagerProxy as LoginManagerProxy;
use zbus_systemd::machine1::{MachineProxy, ManagerProxy as MachineManagerProxy};

/// A machine as `ListMachines` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineEntry {
    pub name: String,
    /// `container`, `vm` or `host` (the `.host` entry machined always lists).
    pub class: String,
    /// Who registered it (`systemd-nspawn`, …).
    pub service: String,
    pub path: OwnedObjectPath,
}

/// One machine's state, from its `org.freedesktop.machine1.Machine` properties.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineInfo {
    pub name: String,
    pub class: String,
    pub service: String,
    /// The unit (or scope) that holds the machine, e.g. `systemd-nspawn@kube1.service`.
    pub unit: String,
    /// The machine's PID 1, as seen from the manager's PID namespace.
    pub leader: u32,
    /// `opening`, `running` or `closing`.
    pub state: String,
    /// When machined registered it (wall clock); `None` if machined reports 0.
    pub registered_at: Option<Timestamp>,
}

/// A machine name as machined accepts it (a hostname label sequence, or `.host`), never a
/// path.
pub(super) fn check_machine_name(name: &str) -> EffectResult {
    let ok = name == ".host"
        || !name.is_empty()
            && name.len() <= 64
            && !name.starts_with(['.', '-'])
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(EffectError::Failed(format!(
            "invalid machine name {name:?}"
        )))
    }
}

impl DbusSystemd {
    /// Reboots the system the bus belongs to: `org.freedesktop.login1.Manager.Reboot(false)`
    /// (not interactive: no polkit prompt; root is always allowed). Returns once logind has
    /// accepted the request; the shutdown itself follows and this connection then drops.
    pub async fn reboot(&self) -> EffectResult {
        let login = LoginManagerProxy::builder(self.manager.inner().connection())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| bus_failed("reboot: connect to logind", e))?;
        login
            .reboot(false)
            .await
            .map_err(|e| bus_failed("reboot (login1 Reboot)", e))
    }

    async fn machined_proxy(&self, what: &str) -> EffectResult<MachineManagerProxy<'static>> {
        MachineManagerProxy::builder(self.manager.inner().connection())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| bus_failed(&format!("{what}: connect to machined"), e))
    }

    /// Every machine machined knows, `.host` included.
    pub async fn list_machines(&self) -> EffectResult<Vec<MachineEntry>> {
        let machined = self.machined_proxy("list machines").await?;
        let list = machined
            .list_machines()
            .await
            .map_err(|e| bus_failed("list machines", e))?;
        Ok(list
            .into_iter()
            .map(|(name, class, service, path)| MachineEntry {
                name,
                class,
                service,
                path,
            })
            .collect())
    }

    /// A machine's state, or `None` when machined does not know it (or machined is not
    /// installed on that system).
    pub async fn machine(&self, name: &str) -> EffectResult<Option<MachineInfo>> {
        check_machine_name(name)?;
        let what = format!("machine {name}");
        let machined = self.machined_proxy(&what).await?;
        let path = match machined.get_machine(name.to_string()).await {
            Ok(p) => p,
            Err(e) if is_error(&e, NO_SUCH_MACHINE) || is_error(&e, SERVICE_UNKNOWN) => {
                return Ok(None);
            }
            Err(e) => return Err(bus_failed(&what, e)),
        };
        let m = MachineProxy::builder(self.manager.inner().connection())
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| bus_failed(&what, e))?;
        let read = async {
            let usec = m.timestamp().await?;
            zbus::Result::Ok(MachineInfo {
                name: m.name().await?,
                class: m.class().await?,
                service: m.service().await?,
                unit: m.unit().await?,
                leader: m.leader().await?,
                state: m.state().await?,
                registered_at: (usec > 0).then(|| usec_to_timestamp(usec)),
            })
        };
        match read.await {
            Ok(info) => Ok(Some(info)),
            // Gone between GetMachine and the property reads.
            Err(e) if is_error(&e, UNKNOWN_OBJECT) || is_error(&e, NO_SUCH_MACHINE) => Ok(None),
            Err(e) => Err(bus_failed(&what, e)),
        }
    }

    /// Terminates a machine (`TerminateMachine`: machined stops its unit, or kills its scope)
    /// and waits, up to the job timeout, until machined no longer lists it. Unknown: nothing
    /// to do.
    pub async fn terminate_machine(&self, name: &str) -> EffectResult {
        check_machine_name(name)?;
        let what = format!("terminate machine {name}");
        let machined = self.machined_proxy(&what).await?;
        match machined.terminate_machine(name.to_string()).await {
            Ok(()) => {}
            Err(e) if is_error(&e, NO_SUCH_MACHINE) || is_error(&e, SERVICE_UNKNOWN) => {
                return Ok(());
            }
            Err(e) => return Err(bus_failed(&what, e)),
        }
        let gone = async {
            loop {
                if self.machine(name).await?.is_none() {
                    return Ok::<_, EffectError>(());
                }
                tokio::time::sleep(MACHINE_POLL).await;
            }
        };
        tokio::time::timeout(self.job_timeout, gone)
            .await
            .map_err(|_| {
                EffectError::Failed(format!(
                    "{what}: still registered after {} s",
                    self.job_timeout.as_secs()
                ))
            })?
    }
}
