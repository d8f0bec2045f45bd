"""Drives the NRP emulator with Microsoft's Python SDK (azure-mgmt-network) and checks that the SDK
accepts every answer: status codes, bodies, long-running operations, paging and ARM errors.

Run by nrp-emulator/tests/sdk_conformance.rs (which creates the virtual environment and starts the
emulator):

    python sdk_conformance.py --base-url http://127.0.0.1:PORT --api-version 2026-03-01 --mode sync

The emulator must page listings by 2 (page_size 2). Every case is a named step; the last line of the
output is a JSON summary ({"passed": N, "failed": [...]}) and the exit status is 1 if any step failed.
Steps share state (each builds on the previous ones), in the order of CASES.
"""

import argparse
import ipaddress
import json
import sys
import time
import traceback

from azure.core.credentials import AccessToken
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.network import NetworkManagementClient
from azure.mgmt.network import models as m
from azure.mgmt.network import VERSION as SDK_VERSION

SUB = "00000000-0000-0000-0000-0000000000c1"
RG = "rg-sdk"
RG2 = "rg-sdk-2"
GW = "sg-sdk"


class FakeCredential:
    """A TokenCredential whose token the emulator does not check."""

    def get_token(self, *scopes, **kwargs):
        return AccessToken("fake-token-for-the-emulator", int(time.time()) + 3600)


class Ctx:
    def __init__(self, base_url, api_version, mode):
        self.api_version = api_version
        self.mode = mode
        # No wait between polls beyond the emulator's Retry-After.
        self.client = NetworkManagementClient(
            FakeCredential(), SUB, base_url=base_url, polling_interval=0
        )
        # Every call: the api-version under test; bearer tokens over plain http to the loopback
        # emulator (azure-core refuses them unless the call says enforce_https=False).
        self.kw = dict(api_version=api_version, enforce_https=False)
        self.ids = {}

    def rid(self, kind, name, rg=RG):
        return (
            f"/subscriptions/{SUB}/resourceGroups/{rg}/providers/Microsoft.Network/{kind}/{name}"
        )

    # The gateway actions: synchronous methods in SDKs generated for 2025-09-01 and later (200 with
    # ServiceGatewayActionOkResponseBody), long-running begin_* methods before (202/204).
    def update_services(self, body):
        sg = self.client.service_gateways
        if hasattr(sg, "update_services"):
            result = sg.update_services(RG, GW, body, **self.kw)
            check(result is not None, "updateServices answers a body")
            return result
        return sg.begin_update_services(RG, GW, body, **self.kw).result()

    def update_address_locations(self, body):
        sg = self.client.service_gateways
        if hasattr(sg, "update_address_locations"):
            result = sg.update_address_locations(RG, GW, body, **self.kw)
            check(result is not None, "updateAddressLocations answers a body")
            return result
        return sg.begin_update_address_locations(RG, GW, body, **self.kw).result()

    def services(self):
        pages = list(self.client.service_gateways.get_services(RG, GW, **self.kw).by_page())
        items = [s for p in pages for s in p]
        return {s.name: s for s in items}, len(pages)

    def locations(self):
        pages = list(
            self.client.service_gateways.get_address_locations(RG, GW, **self.kw).by_page()
        )
        items = [l for p in pages for l in p]
        out = {
            l.address_location: {a.address: sorted(a.services or []) for a in (l.addresses or [])}
            for l in items
        }
        return out, len(pages)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def eq(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def expect_error(code, status, call):
    try:
        call()
    except HttpResponseError as e:
        eq(e.status_code, status, f"status of {code}")
        eq(e.error.code if e.error else None, code, "ARM error code")
        check(e.error.message, f"{code} has a message")
        return e
    raise AssertionError(f"expected HttpResponseError {code}, got success")


# ---- service gateways ----------------------------------------------------------------------------


def gateway_get_before_put_is_404(c):
    e = expect_error(
        "ResourceNotFound",
        404,
        lambda: c.client.service_gateways.get(RG, GW, **c.kw),
    )
    check(isinstance(e, ResourceNotFoundError), "the SDK maps 404 to ResourceNotFoundError")


def unknown_api_version_is_refused(c):
    kw = dict(c.kw, api_version="2020-01-01")
    e = expect_error(
        "InvalidApiVersionParameter",
        400,
        lambda: c.client.service_gateways.get(RG, GW, **kw),
    )
    check("2020-01-01" in e.error.message, "the message names the version")


def gateway_create(c):
    subnet = c.rid("virtualNetworks", "vnet") + "/subnets/sg"
    body = m.ServiceGateway(
        location="eastus",
        tags={"team": "clb"},
        zones=["1", "2"],
        sku=m.ServiceGatewaySku(name="Standard", tier="Regional"),
        virtual_network=m.VirtualNetwork(id=c.rid("virtualNetworks", "vnet")),
        route_target_address=m.RouteTargetAddressPropertiesFormat(
            subnet=m.Subnet(id=subnet),
            private_ip_address="10.0.0.10",
            private_ip_allocation_method="Static",
        ),
        route_target_address_v6=m.RouteTargetAddressPropertiesFormat(
            subnet=m.Subnet(id=subnet),
            private_ip_address="fd00::10",
            private_ip_allocation_method="Static",
        ),
    )
    gw = c.client.service_gateways.begin_create_or_update(RG, GW, body, **c.kw).result()
    eq(gw.name, GW, "name")
    eq(gw.id, c.rid("serviceGateways", GW), "id")
    eq(gw.type, "Microsoft.Network/serviceGateways", "type")
    eq(gw.provisioning_state, "Succeeded", "provisioningState")
    check(gw.etag, "etag is set")
    check(gw.resource_guid, "resourceGuid is set")
    c.ids["etag"] = gw.etag


def gateway_get_keeps_what_was_put(c):
    gw = c.client.service_gateways.get(RG, GW, **c.kw)
    eq(gw.location, "eastus", "location")
    eq(gw.tags, {"team": "clb"}, "tags")
    eq(sorted(gw.zones), ["1", "2"], "zones")
    eq(gw.sku.name, "Standard", "sku")
    eq(gw.virtual_network.id, c.rid("virtualNetworks", "vnet"), "virtualNetwork")
    eq(gw.route_target_address.private_ip_address, "10.0.0.10", "routeTargetAddress")
    eq(gw.route_target_address.subnet.id.endswith("/subnets/sg"), True, "subnet")
    eq(gw.route_target_address_v6.private_ip_address, "fd00::10", "routeTargetAddressV6")
    eq(gw.etag, c.ids["etag"], "etag unchanged by a GET")


def gateway_put_again_updates(c):
    body = m.ServiceGateway(location="eastus", tags={"team": "clb", "v": "2"}, zones=["1", "2"])
    gw = c.client.service_gateways.begin_create_or_update(RG, GW, body, **c.kw).result()
    eq(gw.tags, {"team": "clb", "v": "2"}, "tags after the second PUT")
    check(gw.etag != c.ids["etag"], "a PUT changes the etag")
    c.ids["etag"] = gw.etag


def gateway_update_tags(c):
    gw = c.client.service_gateways.update_tags(
        RG, GW, m.TagsObject(tags={"patched": "yes"}), **c.kw
    )
    eq(gw.tags, {"patched": "yes"}, "tags after PATCH")
    eq(gw.name, GW, "PATCH answers the gateway")
    check(gw.etag != c.ids["etag"], "a PATCH changes the etag")
    eq(c.client.service_gateways.get(RG, GW, **c.kw).tags, {"patched": "yes"}, "tags read back")


def gateway_list_and_list_all_page(c):
    for name, rg in [("sg-b", RG), ("sg-c", RG), ("sg-d", RG2)]:
        c.client.service_gateways.begin_create_or_update(
            rg, name, m.ServiceGateway(location="eastus"), **c.kw
        ).result()
    pages = list(c.client.service_gateways.list(RG, **c.kw).by_page())
    names = sorted(g.name for p in pages for g in p)
    eq(names, sorted([GW, "sg-b", "sg-c"]), "gateways of the resource group")
    eq(len(pages), 2, "pages of list (2 per page)")
    pages = list(c.client.service_gateways.list_all(**c.kw).by_page())
    names = sorted(g.name for p in pages for g in p)
    eq(names, sorted([GW, "sg-b", "sg-c", "sg-d"]), "gateways of the subscription")
    eq(len(pages), 2, "pages of list_all (2 per page)")
    for name, rg in [("sg-b", RG), ("sg-c", RG), ("sg-d", RG2)]:
        c.client.service_gateways.begin_delete(rg, name, **c.kw).result()
    eq([g.name for g in c.client.service_gateways.list_all(**c.kw)], [GW], "after deletes")


# ---- public IP, load balancer, NAT gateway ----------------------------------------------------


def public_ip(c, name):
    body = m.PublicIPAddress(
        location="eastus",
        sku=m.PublicIPAddressSku(name="Standard"),
        public_ip_allocation_method="Static",
    )
    pip = c.client.public_ip_addresses.begin_create_or_update(RG, name, body, **c.kw).result()
    eq(pip.provisioning_state, "Succeeded", f"provisioningState of {name}")
    check(pip.ip_address, f"{name} got an address")
    return pip


def load_balancer(c, name, pip_id):
    lb_id = c.rid("loadBalancers", name)
    body = m.LoadBalancer(
        location="eastus",
        sku=m.LoadBalancerSku(name="Standard"),
        frontend_ip_configurations=[
            m.FrontendIPConfiguration(name="fe", public_ip_address=m.PublicIPAddress(id=pip_id))
        ],
        backend_address_pools=[m.BackendAddressPool(name="pool")],
        load_balancing_rules=[
            m.LoadBalancingRule(
                name="tcp-80",
                frontend_ip_configuration=m.SubResource(id=lb_id + "/frontendIPConfigurations/fe"),
                backend_address_pool=m.SubResource(id=lb_id + "/backendAddressPools/pool"),
                protocol="Tcp",
                frontend_port=80,
                backend_port=8080,
            )
        ],
    )
    lb = c.client.load_balancers.begin_create_or_update(RG, name, body, **c.kw).result()
    eq(lb.provisioning_state, "Succeeded", f"provisioningState of {name}")
    return lb


def resources_create_get_delete(c):
    pip = public_ip(c, "pip-tmp")
    eq(c.client.public_ip_addresses.get(RG, "pip-tmp", **c.kw).ip_address, pip.ip_address, "pip")
    lb = load_balancer(c, "lb-tmp", pip.id)
    got = c.client.load_balancers.get(RG, "lb-tmp", **c.kw)
    eq(got.backend_address_pools[0].id, lb.id + "/backendAddressPools/pool", "pool id")
    eq(got.load_balancing_rules[0].backend_port, 8080, "rule")
    nat_pip = public_ip(c, "pip-nat-tmp")
    nat = c.client.nat_gateways.begin_create_or_update(
        RG,
        "nat-tmp",
        m.NatGateway(
            location="eastus",
            sku=m.NatGatewaySku(name="Standard"),
            public_ip_addresses=[m.SubResource(id=nat_pip.id)],
        ),
        **c.kw,
    ).result()
    eq(nat.provisioning_state, "Succeeded", "NAT gateway provisioningState")
    eq(c.client.nat_gateways.get(RG, "nat-tmp", **c.kw).public_ip_addresses[0].id, nat_pip.id, "nat")
    c.client.nat_gateways.begin_delete(RG, "nat-tmp", **c.kw).result()
    c.client.load_balancers.begin_delete(RG, "lb-tmp", **c.kw).result()
    c.client.public_ip_addresses.begin_delete(RG, "pip-tmp", **c.kw).result()
    c.client.public_ip_addresses.begin_delete(RG, "pip-nat-tmp", **c.kw).result()
    for get in [
        lambda: c.client.nat_gateways.get(RG, "nat-tmp", **c.kw),
        lambda: c.client.load_balancers.get(RG, "lb-tmp", **c.kw),
        lambda: c.client.public_ip_addresses.get(RG, "pip-tmp", **c.kw),
    ]:
        expect_error("ResourceNotFound", 404, get)
    # Deleting what is gone succeeds (204).
    c.client.public_ip_addresses.begin_delete(RG, "pip-tmp", **c.kw).result()


def ipv6_public_ip_and_dual_stack_load_balancer(c):
    """An IPv6 public IP (publicIPAddressVersion, publicIpAddress.json) created and read back as the
    SDK models it; a load balancer with a frontend of each family on it; an undefined version
    refused."""
    body = m.PublicIPAddress(
        location="eastus",
        sku=m.PublicIPAddressSku(name="Standard"),
        public_ip_allocation_method="Static",
        public_ip_address_version="IPv6",
    )
    pip6 = c.client.public_ip_addresses.begin_create_or_update(RG, "pip-v6", body, **c.kw).result()
    eq(pip6.public_ip_address_version, "IPv6", "publicIPAddressVersion of the answer")
    eq(pip6.provisioning_state, "Succeeded", "provisioningState of pip-v6")
    addr = ipaddress.ip_address(pip6.ip_address)
    eq(addr.version, 6, f"{pip6.ip_address} is IPv6")
    check(addr in ipaddress.ip_network("2001:db8::/32"), f"{addr} is of the documentation prefix")
    got = c.client.public_ip_addresses.get(RG, "pip-v6", **c.kw)
    check(isinstance(got, m.PublicIPAddress), "GET is a PublicIPAddress")
    eq(got.public_ip_address_version, "IPv6", "publicIPAddressVersion read back")
    eq(got.ip_address, pip6.ip_address, "ipAddress read back")
    eq(got.public_ip_allocation_method, "Static", "publicIPAllocationMethod read back")
    listed = {p.name: p for p in c.client.public_ip_addresses.list(RG, **c.kw)}
    eq(listed["pip-v6"].public_ip_address_version, "IPv6", "publicIPAddressVersion listed")
    # Absent, the version is IPv4, and the answer says so.
    pip4 = public_ip(c, "pip-v4")
    eq(pip4.public_ip_address_version, "IPv4", "the default version")
    eq(ipaddress.ip_address(pip4.ip_address).version, 4, "an IPv4 address")
    # One load balancer, a frontend of each family (the frontend takes its public IP's).
    lb_id = c.rid("loadBalancers", "lb-dual")

    def rule(name, fe, pool):
        return m.LoadBalancingRule(
            name=name,
            frontend_ip_configuration=m.SubResource(id=f"{lb_id}/frontendIPConfigurations/{fe}"),
            backend_address_pool=m.SubResource(id=f"{lb_id}/backendAddressPools/{pool}"),
            protocol="Tcp",
            frontend_port=80,
            backend_port=8080,
        )

    lb = c.client.load_balancers.begin_create_or_update(
        RG,
        "lb-dual",
        m.LoadBalancer(
            location="eastus",
            sku=m.LoadBalancerSku(name="Standard"),
            frontend_ip_configurations=[
                m.FrontendIPConfiguration(name="fe", public_ip_address=m.PublicIPAddress(id=pip4.id)),
                m.FrontendIPConfiguration(
                    name="fe-v6", public_ip_address=m.PublicIPAddress(id=pip6.id)
                ),
            ],
            backend_address_pools=[m.BackendAddressPool(name="pool"), m.BackendAddressPool(name="pool-v6")],
            load_balancing_rules=[rule("tcp-80", "fe", "pool"), rule("tcp-80-v6", "fe-v6", "pool-v6")],
        ),
        **c.kw,
    ).result()
    got = c.client.load_balancers.get(RG, "lb-dual", **c.kw)
    fes = {f.name: f for f in got.frontend_ip_configurations}
    eq(fes["fe-v6"].public_ip_address.id, pip6.id, "the IPv6 frontend's public IP")
    eq(fes["fe"].public_ip_address.id, pip4.id, "the IPv4 frontend's public IP")
    eq(lb.provisioning_state, "Succeeded", "provisioningState of lb-dual")
    expect_error(
        "InvalidPublicIPAddressVersion",
        400,
        lambda: c.client.public_ip_addresses.begin_create_or_update(
            RG,
            "pip-v7",
            m.PublicIPAddress(location="eastus", public_ip_address_version="IPv7"),
            **c.kw,
        ).result(),
    )
    expect_error(
        "ResourceNotFound", 404, lambda: c.client.public_ip_addresses.get(RG, "pip-v7", **c.kw)
    )
    c.client.load_balancers.begin_delete(RG, "lb-dual", **c.kw).result()
    c.client.public_ip_addresses.begin_delete(RG, "pip-v6", **c.kw).result()
    c.client.public_ip_addresses.begin_delete(RG, "pip-v4", **c.kw).result()


def nat_gateway_with_ipv6_public_ip(c):
    """A StandardV2 NAT gateway with an IPv6 public IP (natGateway.json's publicIpAddressesV6) as the
    SDK models it: created and read back; a Standard NAT gateway with one, and an IPv6 public
    IP that is not StandardV2, refused (the emulator's codes: Azure publishes none)."""

    def pip(name, version, sku):
        body = m.PublicIPAddress(
            location="eastus",
            sku=m.PublicIPAddressSku(name=sku),
            public_ip_allocation_method="Static",
            public_ip_address_version=version,
        )
        return c.client.public_ip_addresses.begin_create_or_update(RG, name, body, **c.kw).result()

    v4 = pip("pip-natv6", "IPv4", "StandardV2")
    v6 = pip("pip-natv6-v6", "IPv6", "StandardV2")
    eq(v6.sku.name, "StandardV2", "the IPv6 public IP's SKU")
    eq(ipaddress.ip_address(v6.ip_address).version, 6, "the IPv6 public IP's address")

    def nat(name, sku, v6_ids):
        return c.client.nat_gateways.begin_create_or_update(
            RG,
            name,
            m.NatGateway(
                location="eastus",
                sku=m.NatGatewaySku(name=sku),
                public_ip_addresses=[m.SubResource(id=v4.id)],
                public_ip_addresses_v6=[m.SubResource(id=i) for i in v6_ids],
            ),
            **c.kw,
        ).result()

    expect_error("NatGatewaySkuDoesNotSupportIpv6", 400, lambda: nat("natv6", "Standard", [v6.id]))
    std6 = pip("pip-std-v6", "IPv6", "Standard")
    expect_error(
        "NatGatewayIpv6PublicIpSkuMismatch", 400, lambda: nat("natv6", "StandardV2", [std6.id])
    )
    expect_error("ResourceNotFound", 404, lambda: c.client.nat_gateways.get(RG, "natv6", **c.kw))
    made = nat("natv6", "StandardV2", [v6.id])
    eq(made.provisioning_state, "Succeeded", "NAT gateway provisioningState")
    got = c.client.nat_gateways.get(RG, "natv6", **c.kw)
    check(isinstance(got, m.NatGateway), "GET is a NatGateway")
    eq(got.sku.name, "StandardV2", "the NAT gateway's SKU read back")
    eq([p.id for p in got.public_ip_addresses_v6], [v6.id], "publicIpAddressesV6 read back")
    eq([p.id for p in got.public_ip_addresses], [v4.id], "publicIpAddresses read back")
    c.client.nat_gateways.begin_delete(RG, "natv6", **c.kw).result()
    for name in ["pip-natv6", "pip-natv6-v6", "pip-std-v6"]:
        c.client.public_ip_addresses.begin_delete(RG, name, **c.kw).result()


def load_balancer_rule_settings(c):
    """A Container Load Balancer's rule settings as the SDK models them (loadBalancer.json):
    idleTimeoutInMinutes, enableTcpReset, enableFloatingIP and loadDistribution on a frontend whose
    public IP is StandardV2, read back; an idle timeout outside 4 to 30 refused; the public IP says
    which frontend uses it (ipConfiguration)."""
    pip = c.client.public_ip_addresses.begin_create_or_update(
        RG,
        "pip-clb",
        m.PublicIPAddress(
            location="eastus",
            sku=m.PublicIPAddressSku(name="StandardV2", tier="Regional"),
            public_ip_allocation_method="Static",
        ),
        **c.kw,
    ).result()
    eq(pip.sku.name, "StandardV2", "the public IP's SKU")
    lb_id = c.rid("loadBalancers", "lb-clb")

    def body(idle, distribution):
        return m.LoadBalancer(
            location="eastus",
            sku=m.LoadBalancerSku(name="Standard"),
            frontend_ip_configurations=[
                m.FrontendIPConfiguration(name="fe", public_ip_address=m.PublicIPAddress(id=pip.id))
            ],
            backend_address_pools=[m.BackendAddressPool(name="pool")],
            load_balancing_rules=[
                m.LoadBalancingRule(
                    name="tcp-80",
                    frontend_ip_configuration=m.SubResource(id=lb_id + "/frontendIPConfigurations/fe"),
                    backend_address_pool=m.SubResource(id=lb_id + "/backendAddressPools/pool"),
                    protocol="Tcp",
                    frontend_port=80,
                    backend_port=8080,
                    idle_timeout_in_minutes=idle,
                    enable_tcp_reset=True,
                    enable_floating_ip=False,
                    load_distribution=distribution,
                )
            ],
        )

    expect_error(
        "LoadBalancingRuleIdleTimeoutOutOfRange",
        400,
        lambda: c.client.load_balancers.begin_create_or_update(
            RG, "lb-clb", body(31, "Default"), **c.kw
        ).result(),
    )
    expect_error(
        "ResourceNotFound", 404, lambda: c.client.load_balancers.get(RG, "lb-clb", **c.kw)
    )
    c.client.load_balancers.begin_create_or_update(
        RG, "lb-clb", body(17, m.LoadDistribution.SOURCE_IP), **c.kw
    ).result()
    rule = c.client.load_balancers.get(RG, "lb-clb", **c.kw).load_balancing_rules[0]
    eq(rule.idle_timeout_in_minutes, 17, "idleTimeoutInMinutes read back")
    eq(rule.enable_tcp_reset, True, "enableTcpReset read back")
    eq(rule.enable_floating_ip, False, "enableFloatingIP read back")
    eq(rule.load_distribution, "SourceIP", "loadDistribution read back")
    got = c.client.public_ip_addresses.get(RG, "pip-clb", **c.kw)
    eq(got.ip_configuration.id, lb_id + "/frontendIPConfigurations/fe", "ipConfiguration")
    c.client.load_balancers.begin_delete(RG, "lb-clb", **c.kw).result()
    got = c.client.public_ip_addresses.get(RG, "pip-clb", **c.kw)
    eq(got.ip_configuration, None, "no ipConfiguration once the load balancer is gone")
    c.client.public_ip_addresses.begin_delete(RG, "pip-clb", **c.kw).result()


def public_ip_dns_settings(c):
    """A public IP's dnsSettings as the SDK models them (PublicIPAddressDnsSettings): the label kept,
    the fqdn Azure's; an invalid label and one another public IP of the region has refused with
    Azure's codes; a PUT without dnsSettings removes the label."""

    def put(name, label, rg=RG):
        return c.client.public_ip_addresses.begin_create_or_update(
            rg,
            name,
            m.PublicIPAddress(
                location="eastus",
                sku=m.PublicIPAddressSku(name="StandardV2"),
                public_ip_allocation_method="Static",
                dns_settings=m.PublicIPAddressDnsSettings(domain_name_label=label) if label else None,
            ),
            **c.kw,
        ).result()

    made = put("pip-dns", "clb-sdk-shop")
    eq(made.dns_settings.domain_name_label, "clb-sdk-shop", "domainNameLabel")
    eq(made.dns_settings.fqdn, "clb-sdk-shop.eastus.cloudapp.azure.com", "fqdn")
    got = c.client.public_ip_addresses.get(RG, "pip-dns", **c.kw)
    eq(got.dns_settings.fqdn, "clb-sdk-shop.eastus.cloudapp.azure.com", "fqdn read back")
    expect_error("InvalidDomainNameLabel", 400, lambda: put("pip-dns-2", "Not_A_Label"))
    expect_error("DnsRecordInUse", 400, lambda: put("pip-dns-2", "clb-sdk-shop", RG2))
    put("pip-dns", None)
    eq(c.client.public_ip_addresses.get(RG, "pip-dns", **c.kw).dns_settings, None, "label removed")
    c.client.public_ip_addresses.begin_delete(RG, "pip-dns", **c.kw).result()


def resources_for_services(c):
    for i in range(1, 6):
        pip = public_ip(c, f"pip-{i}")
        lb = load_balancer(c, f"lb-{i}", pip.id)
        c.ids[f"pool-{i}"] = lb.id + "/backendAddressPools/pool"
    nat_pip = public_ip(c, "pip-nat")
    nat = c.client.nat_gateways.begin_create_or_update(
        RG,
        "nat-1",
        m.NatGateway(location="eastus", public_ip_addresses=[m.SubResource(id=nat_pip.id)]),
        **c.kw,
    ).result()
    c.ids["nat"] = nat.id


# ---- updateServices -------------------------------------------------------------------------------


def service(c, name, kind, pool=None, nat=False):
    return m.ServiceGatewayServiceRequest(
        is_delete=False,
        service=m.ServiceGatewayService(
            name=name,
            service_type=kind,
            load_balancer_backend_pools=[m.BackendAddressPool(id=c.ids[pool])] if pool else None,
            public_nat_gateway_id=c.ids["nat"] if nat else None,
        ),
    )


def delete_service(name):
    return m.ServiceGatewayServiceRequest(
        is_delete=True, service=m.ServiceGatewayService(name=name)
    )


def services_partial_update_three_types(c):
    c.update_services(
        m.ServiceGatewayUpdateServicesRequest(
            action="PartialUpdate",
            service_requests=[
                service(c, "svc-in", "Inbound", pool="pool-1"),
                service(c, "svc-out", "Outbound", nat=True),
                service(c, "svc-io", "InboundOutbound", pool="pool-2", nat=True),
            ],
        )
    )
    got, _ = c.services()
    eq(sorted(got), ["svc-in", "svc-io", "svc-out"], "services")
    eq(got["svc-in"].service_type, "Inbound", "svc-in type")
    eq(got["svc-in"].load_balancer_backend_pools[0].id, c.ids["pool-1"], "svc-in pool")
    eq(got["svc-out"].service_type, "Outbound", "svc-out type")
    eq(got["svc-out"].public_nat_gateway_id, c.ids["nat"], "svc-out NAT gateway")
    eq(got["svc-io"].service_type, "InboundOutbound", "svc-io type")


def services_paged(c):
    c.update_services(
        m.ServiceGatewayUpdateServicesRequest(
            action="PartialUpdate",
            service_requests=[
                service(c, "svc-p3", "Inbound", pool="pool-3"),
                service(c, "svc-p4", "Inbound", pool="pool-4"),
            ],
        )
    )
    got, pages = c.services()
    eq(len(got), 5, "services listed")
    eq(pages, 3, "pages of services (2 per page)")


def services_full_update(c):
    c.update_services(
        m.ServiceGatewayUpdateServicesRequest(
            action="FullUpdate",
            service_requests=[
                service(c, "svc-in", "Inbound", pool="pool-1"),
                service(c, "svc-io", "InboundOutbound", pool="pool-2", nat=True),
                service(c, "svc-p3", "Inbound", pool="pool-3"),
            ],
        )
    )
    got, _ = c.services()
    eq(sorted(got), ["svc-in", "svc-io", "svc-p3"], "services after a full update")


def services_partial_delete(c):
    c.update_services(
        m.ServiceGatewayUpdateServicesRequest(
            action="PartialUpdate", service_requests=[delete_service("svc-p3")]
        )
    )
    got, _ = c.services()
    eq(sorted(got), ["svc-in", "svc-io"], "services after deleting svc-p3")


# ---- updateAddressLocations -----------------------------------------------------------------------


def loc(location, action, addresses):
    return m.ServiceGatewayAddressLocation(
        address_location=location,
        address_update_action=action,
        addresses=[m.ServiceGatewayAddress(address=a, services=s) for a, s in addresses],
    )


def locations_request(action, locations):
    return m.ServiceGatewayUpdateAddressLocationsRequest(action=action, address_locations=locations)


def locations_full_update(c):
    c.update_address_locations(
        locations_request(
            "FullUpdate",
            [
                loc("10.0.0.1", "FullUpdate", [("10.1.0.1", ["svc-in"]), ("10.1.0.2", ["svc-io"])]),
                loc("10.0.0.2", "FullUpdate", [("10.1.0.3", ["svc-in", "svc-io"])]),
                loc("10.0.0.3", "FullUpdate", [("10.1.0.4", ["svc-in"])]),
                loc("10.0.0.4", "FullUpdate", [("10.1.0.5", ["svc-io"])]),
                loc("10.0.0.5", "FullUpdate", [("10.1.0.6", ["svc-in"])]),
            ],
        )
    )
    got, pages = c.locations()
    eq(sorted(got), ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"], "locations")
    eq(got["10.0.0.2"], {"10.1.0.3": ["svc-in", "svc-io"]}, "10.0.0.2")
    eq(pages, 3, "pages of address locations (2 per page)")
    # A top-level full update removes the locations it does not list.
    c.update_address_locations(
        locations_request(
            "FullUpdate",
            [
                loc("10.0.0.1", "PartialUpdate", [("10.1.0.1", ["svc-in"])]),
                loc("10.0.0.2", "PartialUpdate", [("10.1.0.3", ["svc-in", "svc-io"])]),
                loc("10.0.0.3", "PartialUpdate", [("10.1.0.4", ["svc-in"])]),
            ],
        )
    )
    got, _ = c.locations()
    eq(sorted(got), ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "locations after a full update")
    eq(got["10.0.0.1"], {"10.1.0.1": ["svc-in"], "10.1.0.2": ["svc-io"]}, "partial kept 10.1.0.2")


def locations_location_level_full_update(c):
    c.update_address_locations(
        locations_request(
            "PartialUpdate", [loc("10.0.0.1", "FullUpdate", [("10.1.0.7", ["svc-io"])])]
        )
    )
    got, _ = c.locations()
    eq(got["10.0.0.1"], {"10.1.0.7": ["svc-io"]}, "a location-level full update replaces")
    eq(sorted(got), ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "other locations untouched")


def locations_partial_address_without_services_is_deleted(c):
    c.update_address_locations(
        locations_request(
            "PartialUpdate",
            [loc("10.0.0.2", "PartialUpdate", [("10.1.0.3", []), ("10.1.0.8", ["svc-in"])])],
        )
    )
    got, _ = c.locations()
    eq(got["10.0.0.2"], {"10.1.0.8": ["svc-in"]}, "an address without services is deleted")


def locations_partial_without_addresses_deletes_them(c):
    c.update_address_locations(
        locations_request("PartialUpdate", [loc("10.0.0.3", "PartialUpdate", [])])
    )
    got, _ = c.locations()
    check("10.0.0.3" not in got, f"10.0.0.3 lost its addresses: {got}")
    eq(sorted(got), ["10.0.0.1", "10.0.0.2"], "locations left")


# ---- ARM errors -----------------------------------------------------------------------------------


def error_unregistered_service(c):
    expect_error(
        "ServiceNotRegistered",
        400,
        lambda: c.update_address_locations(
            locations_request(
                "PartialUpdate", [loc("10.0.0.9", "PartialUpdate", [("10.1.0.9", ["nope"])])]
            )
        ),
    )
    got, _ = c.locations()
    check("10.0.0.9" not in got, "a refused call changes nothing")


def error_duplicate_locations(c):
    expect_error(
        "DuplicateLocationsInRequest",
        400,
        lambda: c.update_address_locations(
            locations_request(
                "PartialUpdate",
                [
                    loc("10.0.0.8", "PartialUpdate", [("10.1.0.10", ["svc-in"])]),
                    loc("10.0.0.8", "PartialUpdate", [("10.1.0.11", ["svc-in"])]),
                ],
            )
        ),
    )


def error_service_with_mappings_cannot_be_deleted(c):
    expect_error(
        "ServiceWithOverlayMappingsCannotBeDeleted",
        400,
        lambda: c.update_services(
            m.ServiceGatewayUpdateServicesRequest(
                action="PartialUpdate", service_requests=[delete_service("svc-in")]
            )
        ),
    )
    got, _ = c.services()
    check("svc-in" in got, "svc-in is still there")


def error_address_of_the_other_ip_version(c):
    """svc-in holds IPv4 addresses only: an IPv6 address for it is refused, and changes nothing."""
    expect_error(
        "BackendPoolAddressesMustHaveSameIpVersion",
        400,
        lambda: c.update_address_locations(
            locations_request(
                "PartialUpdate", [loc("fd00::9", "PartialUpdate", [("fd01::9", ["svc-in"])])]
            )
        ),
    )
    got, _ = c.locations()
    check("fd00::9" not in got, "a refused call changes nothing")


def dual_stack_services_one_unit_per_family(c):
    """A dual-stack Service as clb (and cloud-provider-azure) serves it: one unit per IP family, each
    its own public IP (of its version), load balancer, backend pool and gateway service; each
    family's addresses registered to its own service. An IPv4 address for the IPv6 unit is refused
    (a load balancer translates IPv4 to IPv4 and IPv6 to IPv6 only) and changes nothing."""
    pip4 = public_ip(c, "pip-fam")
    pip6 = c.client.public_ip_addresses.begin_create_or_update(
        RG,
        "pip-fam-v6",
        m.PublicIPAddress(
            location="eastus",
            sku=m.PublicIPAddressSku(name="Standard"),
            public_ip_allocation_method="Static",
            public_ip_address_version="IPv6",
        ),
        **c.kw,
    ).result()
    eq(pip6.public_ip_address_version, "IPv6", "the IPv6 unit's public IP")
    for name, pip in [("fam", pip4), ("fam-v6", pip6)]:
        lb = load_balancer(c, f"lb-{name}", pip.id)
        eq(lb.frontend_ip_configurations[0].public_ip_address.id, pip.id, f"lb-{name} frontend")
        c.ids[f"pool-{name}"] = lb.id + "/backendAddressPools/pool"
    c.update_services(
        m.ServiceGatewayUpdateServicesRequest(
            action="PartialUpdate",
            service_requests=[
                service(c, "svc-fam", "Inbound", pool="pool-fam"),
                service(c, "svc-fam-v6", "Inbound", pool="pool-fam-v6"),
            ],
        )
    )
    got, _ = c.services()
    eq(got["svc-fam-v6"].load_balancer_backend_pools[0].id, c.ids["pool-fam-v6"], "its own pool")
    expect_error(
        "BackendAddressIpVersionDoesNotMatchFrontend",
        400,
        lambda: c.update_address_locations(
            locations_request(
                "PartialUpdate", [loc("10.9.0.1", "PartialUpdate", [("10.9.1.1", ["svc-fam-v6"])])]
            )
        ),
    )
    got, _ = c.locations()
    check("10.9.0.1" not in got, "a refused call changes nothing")
    c.update_address_locations(
        locations_request(
            "PartialUpdate",
            [
                loc("10.9.0.1", "PartialUpdate", [("10.9.1.1", ["svc-fam"])]),
                loc("fd09::1", "PartialUpdate", [("fd09:1::1", ["svc-fam-v6"])]),
            ],
        )
    )
    got, _ = c.locations()
    eq(got["10.9.0.1"], {"10.9.1.1": ["svc-fam"]}, "the IPv4 family's address")
    eq(got["fd09::1"], {"fd09:1::1": ["svc-fam-v6"]}, "the IPv6 family's address")


# ---- teardown -------------------------------------------------------------------------------------


def gateway_delete_then_404(c):
    c.client.service_gateways.begin_delete(RG, GW, **c.kw).result()
    expect_error("ResourceNotFound", 404, lambda: c.client.service_gateways.get(RG, GW, **c.kw))
    expect_error(
        "ResourceNotFound",
        404,
        lambda: list(c.client.service_gateways.get_services(RG, GW, **c.kw)),
    )
    # Deleting it again succeeds (204).
    c.client.service_gateways.begin_delete(RG, GW, **c.kw).result()
    eq(list(c.client.service_gateways.list(RG, **c.kw)), [], "no gateway left")


CASES = [
    gateway_get_before_put_is_404,
    unknown_api_version_is_refused,
    gateway_create,
    gateway_get_keeps_what_was_put,
    gateway_put_again_updates,
    gateway_update_tags,
    gateway_list_and_list_all_page,
    resources_create_get_delete,
    ipv6_public_ip_and_dual_stack_load_balancer,
    nat_gateway_with_ipv6_public_ip,
    load_balancer_rule_settings,
    public_ip_dns_settings,
    resources_for_services,
    services_partial_update_three_types,
    services_paged,
    services_full_update,
    services_partial_delete,
    locations_full_update,
    locations_location_level_full_update,
    locations_partial_address_without_services_is_deleted,
    locations_partial_without_addresses_deletes_them,
    error_unregistered_service,
    error_duplicate_locations,
    error_service_with_mappings_cannot_be_deleted,
    error_address_of_the_other_ip_version,
    dual_stack_services_one_unit_per_family,
    gateway_delete_then_404,
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-version", required=True)
    p.add_argument("--mode", choices=["sync", "lro"], required=True)
    args = p.parse_args()
    c = Ctx(args.base_url, args.api_version, args.mode)
    passed, failed = [], []
    for case in CASES:
        name = case.__name__
        try:
            case(c)
            passed.append(name)
            print(f"ok   {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the run goes on
            failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(file=sys.stdout)
    summary = {
        "sdk": SDK_VERSION,
        "api_version": args.api_version,
        "mode": args.mode,
        "cases": len(CASES),
        "passed": len(passed),
        "failed": failed,
    }
    print(json.dumps(summary), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
