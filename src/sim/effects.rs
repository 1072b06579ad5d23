//! The effects traits over the simulated world, behaving as the real daemons do (the effects
//! contract in `tests/effects/effects_contract.rs` holds both to the same cases).

use super::host::SimHost;
use super::world::*;
use crate::effects::{
    Containerd, EffectError, EffectResult, Host, MachineStatus, MachineTree, Systemd,
    check_unit_name,
};
use crate::lifecycle::Timestamp;
use crate::lifecycle::agent::{AgentBuild, ArchiveUrl, ImageRef, InstallMode, Sha256Hex, Slot};
use crate::lifecycle::state::{Goal, Side};
use std::path::{Path, PathBuf};

/// Where the simulated machine trees are (a name only: nothing is written).
const SIM_MACHINES: &str = "/sim/machines";

fn sim_side(dir: &Path) -> EffectResult<Side> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    [Side::Kube1, Side::Kube2]
        .into_iter()
        .find(|s| s.name() == name && dir.starts_with(SIM_MACHINES))
        .ok_or_else(|| EffectError::Failed(format!("{} is not a machine tree", dir.display())))
}

impl Systemd for SimHost {
    async fn write_unit(&self, name: &str, contents: &str) -> EffectResult<bool> {
        self.run("write_unit", name, |w| {
            check_unit_name(name)?;
            let u = w.units.entry(name.to_string()).or_default();
            let changed = !(u.file && u.contents == contents);
            u.contents = contents.to_string();
            u.file = true;
            u.stale |= changed;
            Ok(changed)
        })
    }

    async fn write_drop_in(&self, unit: &str, contents: &str) -> EffectResult<bool> {
        self.run("write_drop_in", unit, |w| {
            check_unit_name(unit)?;
            let changed = w.drop_ins.get(unit).map(String::as_str) != Some(contents);
            w.drop_ins.insert(unit.to_string(), contents.to_string());
            if let Some(u) = w.units.get_mut(unit) {
                u.stale |= changed;
            }
            Ok(changed)
        })
    }

    async fn remove_drop_in(&self, unit: &str) -> EffectResult<bool> {
        self.run("remove_drop_in", unit, |w| {
            check_unit_name(unit)?;
            Ok(w.drop_ins.remove(unit).is_some())
        })
    }

    /// The file goes; a running unit keeps running until stopped.
    async fn remove_unit(&self, name: &str) -> EffectResult {
        self.run("remove_unit", name, |w| {
            check_unit_name(name)?;
            if let Some(u) = w.units.get_mut(name) {
                u.file = false;
                u.enabled = false;
                u.masked = false;
                u.contents.clear();
            }
            w.collect(name);
            Ok(())
        })
    }

    async fn unit_file_present(&self, name: &str) -> EffectResult<bool> {
        self.read("unit_file_present", name)?;
        check_unit_name(name)?;
        Ok(self.world().units.get(name).is_some_and(|u| u.file))
    }

    async fn is_enabled(&self, unit: &str) -> EffectResult<bool> {
        self.read("is_enabled", unit)?;
        check_unit_name(unit)?;
        let mut w = self.world();
        if let Some(side) = World::machine_side(unit) {
            return Ok(w.machine(side).enabled);
        }
        Ok(w.units.get(unit).is_some_and(|u| u.enabled))
    }

    async fn daemon_reload(&self) -> EffectResult {
        self.run("daemon_reload", "", |w| {
            w.reloads += 1;
            w.units.values_mut().for_each(|u| u.stale = false);
            Ok(())
        })
    }

    async fn needs_reload(&self, unit: &str) -> EffectResult<bool> {
        self.read("needs_reload", unit)?;
        Ok(self.world().units.get(unit).is_some_and(|u| u.stale))
    }

    async fn enable(&self, unit: &str) -> EffectResult {
        self.run("enable", unit, |w| {
            check_unit_name(unit)?;
            // A machine unit is an instance of systemd's own template: its file always exists.
            if let Some(side) = World::machine_side(unit) {
                w.machine(side).enabled = true;
                w.reloads += 1;
                return Ok(());
            }
            match w.units.get_mut(unit).filter(|u| u.file) {
                Some(u) => u.enabled = true,
                None => {
                    return Err(EffectError::Failed(format!(
                        "enable {unit}: Unit file {unit} does not exist."
                    )));
                }
            }
            // As systemctl does after changing symlinks.
            w.reloads += 1;
            Ok(())
        })
    }

    async fn mask(&self, unit: &str) -> EffectResult {
        self.run("mask", unit, |w| {
            check_unit_name(unit)?;
            let u = w.units.entry(unit.to_string()).or_default();
            // As systemd: a unit file in the unit directory is not replaced by the mask.
            if u.file {
                return Err(EffectError::Failed(format!(
                    "mask {unit}: File /etc/systemd/system/{unit} already exists."
                )));
            }
            u.masked = true;
            u.enabled = false;
            Ok(())
        })
    }

    async fn swap_units(&self) -> EffectResult<Vec<String>> {
        self.read("swap_units", "")?;
        Ok(self
            .world()
            .units
            .iter()
            .filter(|(name, u)| name.ends_with(".swap") && (u.file || u.active || u.masked))
            .map(|(name, _)| name.clone())
            .collect())
    }

    async fn disable(&self, unit: &str) -> EffectResult {
        self.run("disable", unit, |w| {
            check_unit_name(unit)?;
            if let Some(side) = World::machine_side(unit) {
                w.machine(side).enabled = false;
            }
            if let Some(u) = w.units.get_mut(unit) {
                u.enabled = false;
            }
            w.reloads += 1;
            Ok(())
        })
    }

    async fn start(&self, unit: &str) -> EffectResult {
        self.run("start", unit, |w| {
            check_unit_name(unit)?;
            w.start_unit(unit)
        })
    }

    async fn stop(&self, unit: &str) -> EffectResult {
        self.run("stop", unit, |w| {
            check_unit_name(unit)?;
            w.stop_unit(unit);
            Ok(())
        })
    }

    async fn restart(&self, unit: &str) -> EffectResult {
        self.pause("restart").await;
        self.run("restart", unit, |w| {
            check_unit_name(unit)?;
            if unit == crate::effects::AGENT_UNIT {
                w.agent_restarts += 1;
                w.agent_restart_due = true;
            }
            w.restart_unit(unit)
        })
    }

    // The simulated manager has no jobs to wait for.
    async fn start_no_wait(&self, unit: &str) -> EffectResult {
        self.start(unit).await
    }

    async fn restart_no_wait(&self, unit: &str) -> EffectResult {
        self.restart(unit).await
    }

    async fn reset_failed(&self, unit: &str) -> EffectResult {
        self.run("reset_failed", unit, |w| {
            check_unit_name(unit)?;
            if let Some(u) = w.units.get_mut(unit) {
                u.failed = false;
            }
            Ok(())
        })
    }

    async fn schedule_restart(&self, unit: &str, delay_ms: u64) -> EffectResult {
        self.run("schedule_restart", unit, |w| {
            check_unit_name(unit)?;
            let due = Timestamp::from_millis(
                w.now
                    .millis()
                    .saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX)),
            );
            w.restart_timers.push(RestartTimer {
                unit: unit.to_string(),
                delay_ms,
                due,
                fired: false,
            });
            Ok(())
        })
    }

    async fn active_since(&self, unit: &str) -> EffectResult<Option<Timestamp>> {
        self.read("active_since", unit)?;
        check_unit_name(unit)?;
        let mut w = self.world();
        if let Some(side) = World::machine_side(unit) {
            let m = w.machine(side);
            return Ok(m.started_at.filter(|_| m.running));
        }
        Ok(w.units.get(unit).and_then(|u| u.active_since))
    }

    /// Simulated units start at once: their run begins when they become active.
    async fn started_since(&self, unit: &str) -> EffectResult<Option<Timestamp>> {
        self.read("started_since", unit)?;
        check_unit_name(unit)?;
        let mut w = self.world();
        if let Some(side) = World::machine_side(unit) {
            let m = w.machine(side);
            return Ok(m.started_at.filter(|_| m.running));
        }
        Ok(w.units.get(unit).and_then(|u| u.active_since))
    }

    async fn machine_status(&self, side: Side) -> EffectResult<MachineStatus> {
        self.read("machine_status", side.name())?;
        let mut w = self.world();
        let m = w.machine(side);
        Ok(MachineStatus {
            running: m.running,
            started_at: m.started_at.filter(|_| m.running),
        })
    }
}

impl Containerd for SimHost {
    async fn pull(&self, reference: &str, digest: &Sha256Hex) -> EffectResult {
        self.run("pull", reference, |w| {
            // As the real pull: the reference must be pinned to the digest asked for.
            let (name, pinned) = reference.rsplit_once('@').ok_or_else(|| {
                EffectError::Failed(
                    "image reference: not pinned by digest (registry/repository@sha256:…)".into(),
                )
            })?;
            if pinned != digest.oci() {
                return Err(EffectError::Failed(format!(
                    "image reference is pinned to {pinned}, but {} was requested",
                    digest.oci()
                )));
            }
            let build = w.registry.get(digest.as_str()).cloned().ok_or_else(|| {
                EffectError::Failed(format!("manifest {} not found in {name}", digest.oci()))
            })?;
            w.images.insert(digest.as_str().to_string(), build);
            Ok(())
        })
    }

    async fn image_present(&self, digest: &Sha256Hex) -> EffectResult<bool> {
        self.read("image_present", digest.short())?;
        let w = self.world();
        Ok(w.images.contains_key(digest.as_str()) && !w.foreign_images.contains(digest.as_str()))
    }

    async fn check_image(&self, digest: &Sha256Hex) -> EffectResult<String> {
        self.read("check_image", digest.short())?;
        let w = self.world();
        w.images
            .get(digest.as_str())
            .map(|b| format!("flexnode {}", b.version))
            .ok_or_else(|| EffectError::Failed(format!("image {} is not pulled", digest.oci())))
    }

    async fn name_agent_image(&self, digest: &Sha256Hex) -> EffectResult {
        self.read("name_agent_image", digest.short())?;
        if self.world().images.contains_key(digest.as_str()) {
            Ok(())
        } else {
            Err(EffectError::Failed(format!(
                "image {} is not in containerd",
                digest.oci()
            )))
        }
    }

    async fn resolve_tag(
        &self,
        image: &ImageRef,
        _archive: Option<&Path>,
    ) -> EffectResult<Sha256Hex> {
        let tagged = format!(
            "{}/{}:{}",
            image.registry,
            image.repository,
            image.tag.as_deref().unwrap_or_default()
        );
        self.read("resolve_tag", &tagged)?;
        self.world()
            .tags
            .get(&tagged)
            .and_then(|d| Sha256Hex::parse(d))
            .ok_or_else(|| EffectError::Failed(format!("image {tagged}: not found")))
    }

    async fn pull_content(
        &self,
        reference: &str,
        digest: &Sha256Hex,
        _archive: Option<&Path>,
    ) -> EffectResult {
        Containerd::pull(self, reference, digest).await
    }

    async fn unpack_image_into(&self, digest: &Sha256Hex, dir: &Path) -> EffectResult {
        self.run("unpack_image_into", digest.short(), |w| {
            if !w.images.contains_key(digest.as_str()) {
                return Err(EffectError::Failed(format!(
                    "image {} is not pulled",
                    digest.oci()
                )));
            }
            let side = sim_side(dir)?;
            w.machine(side).unpacked = Some(digest.as_str().to_string());
            Ok(())
        })
    }

    async fn remove_agent_image(&self, digest: &Sha256Hex) -> EffectResult {
        self.run("remove_agent_image", digest.short(), |w| {
            // As the real one: someone else's image is refused, never removed.
            if w.foreign_images.contains(digest.as_str()) {
                return Err(EffectError::Failed(format!(
                    "image {digest} was not pulled by flexnode; not removing it"
                )));
            }
            w.images.remove(digest.as_str());
            Ok(())
        })
    }
}

impl Host for SimHost {
    async fn install_agent(&self, mode: InstallMode, build: &AgentBuild) -> EffectResult {
        self.run("install_agent", mode.as_str(), |w| {
            let installed = Build {
                version: crate::VERSION.to_string(),
                crashes: false,
            };
            match build {
                AgentBuild::Slot { slot } => {
                    w.slots.entry(*slot).or_insert(installed);
                }
                AgentBuild::Image { digest } => {
                    w.images
                        .entry(digest.as_str().to_string())
                        .or_insert(installed);
                }
            }
            w.current = Some(build.clone());
            w.runtime_files = true;
            Ok(())
        })
    }

    async fn stage_archive(
        &self,
        url: &ArchiveUrl,
        sha256: &Sha256Hex,
        build: &AgentBuild,
    ) -> EffectResult {
        self.pause("stage_archive").await;
        self.run("stage_archive", &url.to_string(), |w| {
            let AgentBuild::Slot { slot } = build else {
                return Err(EffectError::Failed(
                    "an archive installs into a slot".into(),
                ));
            };
            let (served_sha, served) = w
                .artifacts
                .get(url.expose())
                .cloned()
                .ok_or_else(|| EffectError::Failed(format!("download of {url} failed: 404")))?;
            if served_sha != sha256.as_str() {
                return Err(EffectError::Failed(
                    "downloaded archive does not match sha256".into(),
                ));
            }
            w.slots.insert(*slot, served);
            Ok(())
        })
    }

    async fn check_candidate(&self, slot: Slot) -> EffectResult<String> {
        let build = &AgentBuild::Slot { slot };
        self.read("check_candidate", &build.to_string())?;
        let w = self.world();
        w.build_of(build)
            .map(|b| format!("flexnode {}", b.version))
            .ok_or_else(|| EffectError::Failed(format!("candidate {build} is not installed")))
    }

    async fn discard_candidate(&self, build: &AgentBuild) -> EffectResult {
        self.run("discard_candidate", &build.to_string(), |w| {
            if w.current.as_ref() != Some(build) {
                match build {
                    AgentBuild::Slot { slot } => {
                        w.slots.remove(slot);
                    }
                    AgentBuild::Image { .. } => {}
                }
            }
            Ok(())
        })
    }

    async fn selected_agent(&self, _mode: InstallMode) -> EffectResult<Option<AgentBuild>> {
        self.read("selected_agent", "")?;
        Ok(self.world().current.clone())
    }

    async fn select_agent(
        &self,
        _mode: InstallMode,
        to: &AgentBuild,
        last_good: &AgentBuild,
    ) -> EffectResult {
        self.run("select_agent", &to.to_string(), |w| {
            if w.build_of(to).is_none() {
                return Err(EffectError::Failed(format!("{to} is not installed")));
            }
            w.last_good = Some(last_good.clone());
            w.current = Some(to.clone());
            Ok(())
        })
    }

    async fn remove_agent_links(&self) -> EffectResult {
        self.run("remove_agent_links", "", |w| {
            w.current = None;
            w.last_good = None;
            Ok(())
        })
    }

    async fn agent_links_present(&self) -> EffectResult<bool> {
        self.read("agent_links_present", "")?;
        let w = self.world();
        Ok(w.current.is_some() || w.last_good.is_some())
    }

    async fn machine_rootfs(&self, side: Side) -> EffectResult<Option<MachineTree>> {
        self.read("machine_rootfs", side.name())?;
        let mut w = self.world();
        let m = w.machine(side);
        Ok(m.kubernetes_version
            .clone()
            .map(|kubernetes_version| MachineTree {
                kubernetes_version,
                image: m.image.as_deref().and_then(Sha256Hex::parse),
                generation: m.generation,
            }))
    }

    async fn machine_tree_exists(&self, side: Side) -> EffectResult<bool> {
        self.read("machine_tree_exists", side.name())?;
        let mut w = self.world();
        let m = w.machine(side);
        Ok(m.kubernetes_version.is_some() || m.unpacked.is_some())
    }

    async fn clear_machine_tree(&self, side: Side) -> EffectResult<PathBuf> {
        self.run("clear_machine_tree", side.name(), |w| {
            let m = w.machine(side);
            m.kubernetes_version = None;
            m.image = None;
            m.generation = None;
            m.unpacked = None;
            Ok(Path::new(SIM_MACHINES).join(side.name()))
        })
    }

    async fn complete_machine(&self, side: Side, goal: &Goal, image: &Sha256Hex) -> EffectResult {
        self.run("complete_machine", side.name(), |w| {
            let m = w.machine(side);
            if m.unpacked.as_deref() != Some(image.as_str()) {
                return Err(EffectError::Failed(format!(
                    "{} holds no unpacked {}",
                    side.name(),
                    image.oci()
                )));
            }
            m.kubernetes_version = Some(goal.kubernetes_version.clone());
            m.image = Some(image.as_str().to_string());
            m.generation = Some(goal.generation);
            Ok(())
        })
    }

    async fn provision_machine(&self, side: Side, kubernetes_version: &str) -> EffectResult {
        self.run("provision_machine", side.name(), |w| {
            let m = w.machine(side);
            m.kubernetes_version = Some(kubernetes_version.to_string());
            m.image = None;
            m.generation = None;
            Ok(())
        })
    }

    async fn remove_machine(&self, side: Side) -> EffectResult {
        self.run("remove_machine", side.name(), |w| {
            let m = w.machine(side);
            m.kubernetes_version = None;
            m.image = None;
            m.generation = None;
            m.unpacked = None;
            m.running = false;
            m.started_at = None;
            Ok(())
        })
    }

    async fn runtime_present(&self) -> EffectResult<bool> {
        self.read("runtime_present", "")?;
        Ok(self.world().runtime_files)
    }

    async fn comment_out_swap(&self) -> EffectResult {
        self.run("comment_out_swap", "", |w| {
            w.fstab_swap = false;
            Ok(())
        })
    }

    async fn load_kernel_modules(&self) -> EffectResult {
        self.run("load_kernel_modules", "", |w| {
            w.kernel_modules = true;
            Ok(())
        })
    }

    async fn wipe_runtime(&self) -> EffectResult {
        self.pause("wipe_runtime").await;
        self.run("wipe_runtime", "", |w| {
            w.runtime_files = false;
            Ok(())
        })
    }
}
