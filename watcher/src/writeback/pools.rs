//! The write-back's side of several gateways: PoolServices (create, delete, status), Services
//! looked at again after a change elsewhere, and the gateways a Service may be in.

use super::*;

impl WriteBack {
    /// Looks at Service `key` and the one with UID `uid` again now (unless one backs off after a
    /// failure: its retry comes).
    pub(super) fn poke(&mut self, key: Option<&ObjKey>, uid: Option<&str>) {
        let by_uid = uid.and_then(|u| self.by_uid.get(u).cloned());
        for k in key.into_iter().cloned().chain(by_uid) {
            if self.records.get(&k).is_some_and(|r| r.retry.is_none()) {
                self.due_now(&k);
            }
        }
    }

    /// The gateways where PoolServices of someone else expose Service `key`.
    pub(super) fn foreign_gateways(&self, key: &ObjKey) -> Vec<String> {
        let Some(g) = &self.config.gateways else {
            return Vec::new();
        };
        self.pools
            .foreign_of(key)
            .filter_map(|p| p.pool.as_deref().and_then(|pool| g.by_pool(pool)))
            .map(|g| g.name.clone())
            .collect()
    }

    pub(super) fn pool_api(&self, namespace: &str) -> Api<PoolService> {
        Api::namespaced(self.kube.clone(), namespace)
    }

    /// Creates the PoolServices of Service `key` in its selected gateways' pools, deletes the ones
    /// of pools no longer selected, and writes the status of every PoolService of the Service
    /// (`states`: each gateway's report of each IP family's identity, primary first). A failed
    /// call is logged, the others go on, and the Service's record retries with backoff
    /// ([`WriteBackError::PoolServices`]).
    pub(super) async fn reconcile_pools(
        &self,
        key: &ObjKey,
        facts: &ServiceFacts,
        states: &BTreeMap<String, Vec<(IpFamily, Option<ServiceState>)>>,
    ) -> Result<(), WriteBackError> {
        let Some(gateways) = self.config.gateways.clone() else {
            return Ok(());
        };
        let mut done = true;
        let api = self.pool_api(&key.namespace);
        let mut want: BTreeMap<String, String> = BTreeMap::new();
        for g in &facts.gateways {
            if let Some(g) = gateways.get(g) {
                want.insert(
                    poolservice::name_for(&key.name, g.pool()),
                    g.pool().to_owned(),
                );
            }
        }
        for (name, pool) in &want {
            let pkey = ObjKey {
                namespace: key.namespace.clone(),
                name: name.clone(),
            };
            match self.pools.get(&pkey) {
                Some(p) if p.owner_uid.as_deref() == Some(facts.uid.as_str()) => continue,
                Some(_) => {
                    tracing::debug!(poolservice = %pkey, "a PoolService of that name exists and is not ours; not creating it");
                    continue;
                }
                None => {}
            }
            let ps = serde_json::json!({
                "apiVersion": "network.openyurt.io/v1alpha1",
                "kind": "PoolService",
                "metadata": {
                    "name": name,
                    "namespace": key.namespace,
                    "labels": {
                        poolservice::LABEL_SERVICE_NAME: key.name,
                        poolservice::LABEL_POOL_NAME: pool,
                        poolservice::LABEL_MANAGED_BY: poolservice::MANAGED_BY,
                    },
                    "ownerReferences": [{
                        "apiVersion": "v1", "kind": "Service", "name": key.name,
                        "uid": facts.uid, "controller": true, "blockOwnerDeletion": true,
                    }],
                },
                "spec": { "loadBalancerClass": self.config.class, "nodepoolName": pool },
            });
            let ps: PoolService = match serde_json::from_value(ps) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(poolservice = %pkey, error = %e, "cannot build the PoolService");
                    continue;
                }
            };
            match api.create(&PostParams::default(), &ps).await {
                Ok(_) => tracing::info!(poolservice = %pkey, %pool, "PoolService created"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    self.config
                        .metrics
                        .writeback_failure("creating a PoolService");
                    tracing::warn!(poolservice = %pkey, error = %e, "creating a PoolService failed");
                    done = false;
                }
            }
        }
        let stale: Vec<ObjKey> = self
            .pools
            .owned_by(&facts.uid)
            .filter(|p| p.key.namespace == key.namespace && !want.contains_key(&p.key.name))
            .map(|p| p.key.clone())
            .collect();
        for pkey in stale {
            done &= self.delete_pool(&pkey).await;
        }
        // Status of every PoolService of this Service, ours and theirs.
        let mine: Vec<PoolServiceFacts> = self
            .pools
            .owned_by(&facts.uid)
            .chain(self.pools.foreign_of(key))
            .filter(|p| p.key.namespace == key.namespace)
            .cloned()
            .collect();
        for p in mine {
            let Some(g) = p.pool.as_deref().and_then(|pool| gateways.by_pool(pool)) else {
                continue;
            };
            let families = states.get(&g.name).map(Vec::as_slice).unwrap_or_default();
            let want = poolservice::status_of(&g.name, families);
            done &= self.pool_status(&p, want).await;
        }
        if done {
            Ok(())
        } else {
            Err(WriteBackError::PoolServices {
                service: key.clone(),
            })
        }
    }

    /// Deletes the PoolServices made for the Service of UID `uid` (it is going, or no longer ours).
    pub(super) async fn delete_owned_pools(
        &self,
        key: &ObjKey,
        uid: &str,
    ) -> Result<(), WriteBackError> {
        if !self.config.pool_services {
            return Ok(());
        }
        let owned: Vec<ObjKey> = self.pools.owned_by(uid).map(|p| p.key.clone()).collect();
        let mut done = true;
        for pkey in owned {
            done &= self.delete_pool(&pkey).await;
        }
        if done {
            Ok(())
        } else {
            Err(WriteBackError::PoolServices {
                service: key.clone(),
            })
        }
    }

    /// Publishes a Warning Event on a PoolService of someone else that cannot be programmed.
    pub(super) async fn publish_on_pool(&self, f: &PoolServiceFacts) {
        let Some(problem) = &f.problem else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some("network.openyurt.io/v1alpha1".to_owned()),
            kind: Some("PoolService".to_owned()),
            name: Some(f.key.name.clone()),
            namespace: Some(f.key.namespace.clone()),
            uid: Some(f.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        };
        let ev = Event {
            type_: EventType::Warning,
            reason: "InvalidPoolService".to_owned(),
            note: Some(truncate(problem.clone(), 1024)),
            action: "Programming".to_owned(),
            secondary: None,
        };
        if let Err(e) = self.publish_event(&ev, &reference).await {
            tracing::warn!(poolservice = %f.key, error = %e, "publishing an event failed");
        }
    }

    /// Deletes PoolService `pkey`; whether it is gone.
    pub(super) async fn delete_pool(&self, pkey: &ObjKey) -> bool {
        match self
            .pool_api(&pkey.namespace)
            .delete(&pkey.name, &DeleteParams::default())
            .await
        {
            Ok(_) => {
                tracing::info!(poolservice = %pkey, "PoolService deleted");
                true
            }
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(e) => {
                self.config
                    .metrics
                    .writeback_failure("deleting a PoolService");
                tracing::warn!(poolservice = %pkey, error = %e, "deleting a PoolService failed");
                false
            }
        }
    }

    /// Writes a PoolService's status (`want`, from its gateway's report of every IP family): the
    /// frontend IPs of the programmed families, and the `Ready` condition. Whether it went through
    /// (a conflict or a missing PoolService does: its next event brings it again).
    pub(super) async fn pool_status(
        &self,
        p: &PoolServiceFacts,
        want: poolservice::PoolStatus,
    ) -> bool {
        let poolservice::PoolStatus {
            ips: want_ingress,
            ready,
            reason,
            message,
        } = want;
        let status = if ready { "True" } else { "False" };
        let current = p.conditions.iter().find(|c| c.type_ == poolservice::READY);
        let condition_due = current.is_none_or(|c| c.status != status || c.reason != reason);
        let ingress_written = ingress::is_written(
            &p.ingress,
            &want_ingress,
            self.pool_ip_mode_kept.load(Ordering::Relaxed),
        );
        if ingress_written && !condition_due {
            return true;
        }
        if self.pool_patched().get(&p.key) == Some(&p.resource_version) {
            return true;
        }
        let mut conditions: Vec<Condition> = p
            .conditions
            .iter()
            .filter(|c| c.type_ != poolservice::READY)
            .cloned()
            .collect();
        conditions.push(Condition {
            type_: poolservice::READY.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            last_transition_time: match current {
                Some(c) if c.status == status => c.last_transition_time.clone(),
                _ => Time(now_seconds()),
            },
            observed_generation: None,
        });
        let ingress = ingress::to_json(&want_ingress);
        let patch = json!({
            "metadata": { "resourceVersion": p.resource_version },
            "status": { "loadBalancer": { "ingress": ingress }, "conditions": conditions },
        });
        match self
            .pool_api(&p.key.namespace)
            .patch_status(&p.key.name, &Self::params(), &Patch::Merge(&patch))
            .await
        {
            Ok(stored) => {
                if !want_ingress.is_empty() {
                    let stored = ingress::entries(
                        stored
                            .status
                            .as_ref()
                            .and_then(|s| s.load_balancer.as_ref()),
                    );
                    Self::note_ip_mode(&self.pool_ip_mode_kept, &stored, "PoolService");
                }
                tracing::info!(poolservice = %p.key, ready = status, ip = %want_ingress.join(","), "PoolService status written");
                self.pool_patched()
                    .insert(p.key.clone(), p.resource_version.clone());
                true
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => true,
            Err(e) => {
                self.config
                    .metrics
                    .writeback_failure("patching a PoolService's status");
                tracing::warn!(poolservice = %p.key, error = %e, "patching a PoolService's status failed");
                false
            }
        }
    }

    fn pool_patched(&self) -> std::sync::MutexGuard<'_, HashMap<ObjKey, String>> {
        self.pool_patched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every gateway a Service may be in: the file's, or `[""]` (the one of `--gateway`).
    pub(super) fn all_gateways(&self) -> Vec<String> {
        match &self.config.gateways {
            Some(g) => g.names(),
            None => vec![String::new()],
        }
    }
}
