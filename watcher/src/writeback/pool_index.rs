//! The PoolServices of our class the write-back knows, by key and indexed by what its lookups ask:
//! someone else's by the Service they expose, ours by the UID of the Service that owns them. A
//! lookup costs what it returns, so the work per event is proportional to what changed, not to
//! every PoolService of the cluster.

use std::collections::{BTreeSet, HashMap};

use crate::poolservice::PoolServiceFacts;
use crate::translate::ObjKey;

/// PoolServices by key, with the two indexes kept in step on every insert and remove.
#[derive(Debug, Default)]
pub(super) struct PoolIndex {
    by_key: HashMap<ObjKey, PoolServiceFacts>,
    /// Someone else's PoolServices (no owner) that name a Service, by that Service.
    foreign: HashMap<ObjKey, BTreeSet<ObjKey>>,
    /// Our PoolServices, by the UID of the Service that owns them.
    owned: HashMap<String, BTreeSet<ObjKey>>,
}

impl PoolIndex {
    /// The PoolService `key`.
    pub(super) fn get(&self, key: &ObjKey) -> Option<&PoolServiceFacts> {
        self.by_key.get(key)
    }

    /// Records `facts` (new, or replacing what was known of its key, whose index entries go).
    pub(super) fn insert(&mut self, facts: PoolServiceFacts) {
        let key = facts.key.clone();
        if let Some(old) = self.by_key.remove(&key) {
            self.unindex(&old);
        }
        match (&facts.owner_uid, &facts.service) {
            (Some(owner), _) => {
                self.owned
                    .entry(owner.clone())
                    .or_default()
                    .insert(key.clone());
            }
            (None, Some(service)) => {
                self.foreign
                    .entry(service.clone())
                    .or_default()
                    .insert(key.clone());
            }
            (None, None) => {}
        }
        self.by_key.insert(key, facts);
    }

    /// Forgets PoolService `key`; what was known of it.
    pub(super) fn remove(&mut self, key: &ObjKey) -> Option<PoolServiceFacts> {
        let old = self.by_key.remove(key)?;
        self.unindex(&old);
        Some(old)
    }

    fn unindex(&mut self, old: &PoolServiceFacts) {
        let (index, at) = match (&old.owner_uid, &old.service) {
            (Some(owner), _) => (&mut self.owned, owner),
            (None, Some(service)) => {
                if let Some(keys) = self.foreign.get_mut(service) {
                    keys.remove(&old.key);
                    if keys.is_empty() {
                        self.foreign.remove(service);
                    }
                }
                return;
            }
            (None, None) => return,
        };
        if let Some(keys) = index.get_mut(at) {
            keys.remove(&old.key);
            if keys.is_empty() {
                index.remove(at);
            }
        }
    }

    /// Someone else's PoolServices that expose Service `service`, in key order.
    pub(super) fn foreign_of(&self, service: &ObjKey) -> impl Iterator<Item = &PoolServiceFacts> {
        self.lookup(self.foreign.get(service))
    }

    /// Our PoolServices made for the Service of UID `uid`, in key order.
    pub(super) fn owned_by(&self, uid: &str) -> impl Iterator<Item = &PoolServiceFacts> {
        self.lookup(self.owned.get(uid))
    }

    fn lookup<'a>(
        &'a self,
        keys: Option<&'a BTreeSet<ObjKey>>,
    ) -> impl Iterator<Item = &'a PoolServiceFacts> + 'a {
        keys.into_iter()
            .flatten()
            .filter_map(|k| self.by_key.get(k))
    }

    /// How many PoolServices are known.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Panics unless both indexes are exactly what a scan of every PoolService gives.
    #[cfg(test)]
    pub(super) fn assert_consistent(&self) {
        let mut foreign: HashMap<ObjKey, BTreeSet<ObjKey>> = HashMap::new();
        let mut owned: HashMap<String, BTreeSet<ObjKey>> = HashMap::new();
        for (key, f) in &self.by_key {
            assert_eq!(key, &f.key);
            match (&f.owner_uid, &f.service) {
                (Some(o), _) => {
                    owned.entry(o.clone()).or_default().insert(key.clone());
                }
                (None, Some(s)) => {
                    foreign.entry(s.clone()).or_default().insert(key.clone());
                }
                (None, None) => {}
            }
        }
        assert_eq!(self.foreign, foreign, "the index by Service");
        assert_eq!(self.owned, owned, "the index by owner UID");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str) -> ObjKey {
        ObjKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    fn pool(name: &str, owner: Option<&str>, service: Option<&str>) -> PoolServiceFacts {
        PoolServiceFacts {
            key: key("ns", name),
            uid: format!("uid-{name}"),
            problem: None,
            resource_version: "1".to_owned(),
            owner_uid: owner.map(str::to_owned),
            service: service.map(|s| key("ns", s)),
            pool: Some("pool-a".to_owned()),
            ingress: Vec::new(),
            conditions: Vec::new(),
        }
    }

    fn names<'a>(it: impl Iterator<Item = &'a PoolServiceFacts>) -> Vec<&'a str> {
        it.map(|p| p.key.name.as_str()).collect()
    }

    #[test]
    fn inserts_index_ours_by_owner_and_theirs_by_service() {
        let mut ix = PoolIndex::default();
        ix.insert(pool("web-a", Some("u1"), Some("web")));
        ix.insert(pool("web-b", Some("u1"), Some("web")));
        ix.insert(pool("theirs", None, Some("web")));
        ix.insert(pool("other", None, Some("api")));
        ix.insert(pool("nameless", None, None));
        ix.assert_consistent();
        assert_eq!(ix.len(), 5);
        assert_eq!(names(ix.owned_by("u1")), ["web-a", "web-b"]);
        assert_eq!(names(ix.foreign_of(&key("ns", "web"))), ["theirs"]);
        assert_eq!(names(ix.foreign_of(&key("ns", "api"))), ["other"]);
        assert!(ix.owned_by("u2").next().is_none());
        assert!(ix.foreign_of(&key("other-ns", "web")).next().is_none());
    }

    #[test]
    fn an_update_moves_the_pool_service_between_index_entries() {
        let mut ix = PoolIndex::default();
        ix.insert(pool("p", None, Some("web")));
        // It now names another Service.
        ix.insert(pool("p", None, Some("api")));
        ix.assert_consistent();
        assert!(ix.foreign_of(&key("ns", "web")).next().is_none());
        assert_eq!(names(ix.foreign_of(&key("ns", "api"))), ["p"]);
        // It is now ours (an owner reference to a Service of UID u7).
        ix.insert(pool("p", Some("u7"), Some("api")));
        ix.assert_consistent();
        assert!(ix.foreign_of(&key("ns", "api")).next().is_none());
        assert_eq!(names(ix.owned_by("u7")), ["p"]);
        // Another owner, then none and no Service.
        ix.insert(pool("p", Some("u8"), None));
        ix.assert_consistent();
        assert!(ix.owned_by("u7").next().is_none());
        assert_eq!(names(ix.owned_by("u8")), ["p"]);
        ix.insert(pool("p", None, None));
        ix.assert_consistent();
        assert!(ix.owned_by("u8").next().is_none());
        assert_eq!(ix.len(), 1);
        // The same facts again change nothing.
        ix.insert(pool("p", None, None));
        ix.assert_consistent();
        assert_eq!(
            ix.get(&key("ns", "p")).map(|p| p.owner_uid.clone()),
            Some(None)
        );
    }

    #[test]
    fn a_removal_leaves_no_index_entry_behind() {
        let mut ix = PoolIndex::default();
        ix.insert(pool("a", Some("u1"), Some("web")));
        ix.insert(pool("b", Some("u1"), Some("web")));
        ix.insert(pool("c", None, Some("web")));
        assert_eq!(
            ix.remove(&key("ns", "a")).map(|p| p.key.name),
            Some("a".into())
        );
        ix.assert_consistent();
        assert_eq!(names(ix.owned_by("u1")), ["b"]);
        ix.remove(&key("ns", "b"));
        ix.remove(&key("ns", "c"));
        ix.assert_consistent();
        assert!(ix.remove(&key("ns", "c")).is_none());
        assert_eq!(ix.len(), 0);
        assert!(ix.owned.is_empty() && ix.foreign.is_empty());
    }

    #[test]
    fn a_random_sequence_keeps_the_indexes_consistent() {
        let mut ix = PoolIndex::default();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let owners = [None, Some("u1"), Some("u2")];
        let services = [None, Some("web"), Some("api")];
        for _ in 0..2000 {
            let name = format!("p{}", next(8));
            if next(4) == 0 {
                ix.remove(&key("ns", &name));
            } else {
                let owner = owners[next(3) as usize];
                let service = services[next(3) as usize];
                ix.insert(pool(&name, owner, service));
            }
            ix.assert_consistent();
        }
    }
}
