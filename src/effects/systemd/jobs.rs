//! systemd jobs: every start, stop and restart is awaited by its `JobRemoved` signal,
//! registered before the call that queues the job; and the transient timer that restarts the
//! agent (`schedule_restart`).

use super::{DbusSystemd, RESTART_ACCURACY_USEC, RESTART_UNIT_PREFIX, bus_failed};
use crate::effects::{EffectError, EffectResult, check_unit_name};
use futures::StreamExt;
use std::future::Future;
use zbus::proxy::CacheProperties;
use zbus::{OwnedObjectPath, OwnedVariant, Variant};
use zbus_systemd::systemd1::{ServiceProxy, UnitProxy};

/// The outcome of a job, as `JobRemoved` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOutcome {
    pub job: OwnedObjectPath,
    /// `done`, `canceled`, `timeout`, `failed`, `dependency`, `skipped`, ...
    pub result: String,
}

/// The method call that queues a job failed, or the job did.
pub(super) enum JobError {
    Call(zbus::Error),
    Effect(EffectError),
}

impl From<EffectError> for JobError {
    fn from(e: EffectError) -> Self {
        Self::Effect(e)
    }
}

pub(super) fn owned<'a>(v: impl Into<Variant<'a>>) -> zbus::Result<OwnedVariant> {
    OwnedVariant::try_from(v.into())
}

impl DbusSystemd {
    /// The transient timer + service names `schedule_restart` used, returned so callers (and
    /// tests) can watch them. Like [`Systemd::schedule_restart`].
    pub async fn schedule_restart_named(
        &self,
        unit: &str,
        delay_ms: u64,
    ) -> EffectResult<(String, String)> {
        check_unit_name(unit)?;
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or_default();
        let timer = format!("{RESTART_UNIT_PREFIX}{n}.timer");
        let service = format!("{RESTART_UNIT_PREFIX}{n}.service");
        let what = format!("schedule restart of {unit}");
        let v = |r: zbus::Result<OwnedVariant>| r.map_err(|e| bus_failed(&what, e));

        let call = |method: &str, args: Vec<String>| {
            let mut argv = vec![
                "busctl".to_string(),
                "call".to_string(),
                "org.freedesktop.systemd1".to_string(),
                "/org/freedesktop/systemd1".to_string(),
                "org.freedesktop.systemd1.Manager".to_string(),
                method.to_string(),
            ];
            argv.extend(args);
            argv
        };
        // A failed unit may not start again until reset; the reset itself may fail (unit not
        // loaded, nothing to reset) without stopping the restart.
        let exec: Vec<(String, Vec<String>, bool)> = vec![
            (
                self.busctl.clone(),
                call("ResetFailedUnit", vec!["s".into(), unit.into()]),
                true,
            ),
            (
                self.busctl.clone(),
                call(
                    "RestartUnit",
                    vec!["ss".into(), unit.into(), "replace".into()],
                ),
                false,
            ),
        ];
        let service_props = vec![
            (
                "Description".to_string(),
                v(owned(format!("flexnode: restart {unit}")))?,
            ),
            ("Type".to_string(), v(owned("oneshot"))?),
            ("ExecStart".to_string(), v(owned(exec))?),
            ("CollectMode".to_string(), v(owned("inactive-or-failed"))?),
        ];
        let timer_props = vec![
            (
                "Description".to_string(),
                v(owned(format!("flexnode: restart {unit} in {delay_ms} ms")))?,
            ),
            (
                "TimersMonotonic".to_string(),
                v(owned(vec![(
                    "OnActiveSec".to_string(),
                    delay_ms.saturating_mul(1000),
                )]))?,
            ),
            (
                "AccuracyUSec".to_string(),
                OwnedVariant::from(RESTART_ACCURACY_USEC),
            ),
            ("RemainAfterElapse".to_string(), OwnedVariant::from(false)),
            ("CollectMode".to_string(), v(owned("inactive-or-failed"))?),
        ];
        self.run_job(
            "start",
            &timer,
            self.manager.start_transient_unit(
                timer.clone(),
                "fail".to_string(),
                timer_props,
                vec![(service.clone(), service_props)],
            ),
        )
        .await?;
        Ok((timer, service))
    }

    /// Registers for `JobRemoved`, then makes the call that queues the job, then waits for that
    /// job's removal. `call` is lazy: it runs only after the match is in place.
    pub async fn run_job(
        &self,
        verb: &str,
        unit: &str,
        call: impl Future<Output = zbus::Result<OwnedObjectPath>>,
    ) -> EffectResult<JobOutcome> {
        self.try_job(verb, unit, call).await.map_err(|e| match e {
            JobError::Call(e) => bus_failed(&format!("{verb} {unit}"), e),
            JobError::Effect(e) => e,
        })
    }

    pub(super) async fn try_job(
        &self,
        verb: &str,
        unit: &str,
        call: impl Future<Output = zbus::Result<OwnedObjectPath>>,
    ) -> Result<JobOutcome, JobError> {
        let mut removed = self
            .manager
            .receive_job_removed()
            .await
            .map_err(|e| bus_failed(&format!("{verb} {unit}: watch jobs"), e))?;
        let job = call.await.map_err(JobError::Call)?;
        let wait = async {
            while let Some(signal) = removed.next().await {
                let args = signal
                    .args()
                    .map_err(|e| bus_failed(&format!("{verb} {unit}: JobRemoved"), e))?;
                if *args.job == *job {
                    return Ok(args.result.clone());
                }
            }
            Err(EffectError::Failed(format!(
                "{verb} {unit}: connection to systemd closed while job {} ran",
                job.as_str()
            )))
        };
        let result = tokio::time::timeout(self.job_timeout, wait)
            .await
            .map_err(|_| {
                EffectError::Failed(format!(
                    "{verb} {unit}: job {} did not finish within {} s",
                    job.as_str(),
                    self.job_timeout.as_secs()
                ))
            })??;
        if result == "done" {
            return Ok(JobOutcome { job, result });
        }
        let detail = self.failure_detail(unit).await;
        Err(EffectError::Failed(format!("{verb} {unit}: job {result}{detail}")).into())
    }

    /// ", unit failed (failed), result exit-code" and the like, best effort.
    async fn failure_detail(&self, unit: &str) -> String {
        let Ok(Some(path)) = self.get_unit(unit).await else {
            return String::new();
        };
        let conn = self.manager.inner().connection();
        let mut detail = String::new();
        if let Ok(p) = UnitProxy::builder(conn)
            .path(path.clone())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            && let (Ok(active), Ok(sub)) = (p.active_state().await, p.sub_state().await)
        {
            detail = format!(", unit {active} ({sub})");
        }
        if unit.ends_with(".service")
            && let Ok(s) = ServiceProxy::builder(conn)
                .path(path)
                .cache_properties(CacheProperties::No)
                .build()
                .await
            && let Ok(r) = s.result().await
            && r != "success"
        {
            detail.push_str(&format!(", result {r}"));
        }
        detail
    }
}
