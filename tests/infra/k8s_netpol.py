"""A small NetworkPolicy evaluator for the rendered manifests: does a TCP connection from one
pod (or from outside) to another pod (or an address) on a port pass both the source's egress
and the target's ingress policies?

It understands what infra/k8s uses: ``matchLabels`` pod and namespace selectors, ``ipBlock``
peers, ports by number or by container port name; not ``matchExpressions``, ``except`` or
port ranges (a manifest using them needs this extended first).
"""

from __future__ import annotations

from typing import Any

from tests.infra.k8s_render import of_kind, pod_specs


def port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(number)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items()


def pod_of(objects: list[dict[str, Any]], name: str) -> tuple[dict[str, str], dict[str, Any]]:
    (pod,) = [p for n, p in pod_specs(objects) if n == name]
    return pod["metadata"]["labels"], pod["spec"]["containers"][0]


def peer_allows(peer: dict[str, Any], labels: dict[str, str] | None, ns: str,
                ip: str | None) -> bool:
    if "ipBlock" in peer:
        return ip is not None and (peer["ipBlock"]["cidr"] == "0.0.0.0/0" or ip == "in-block")
    ns_ok = ("namespaceSelector" not in peer and ns == "framefleet") or (
        "namespaceSelector" in peer
        and selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": ns}))
    return labels is not None and ns_ok and selects(peer.get("podSelector", {}), labels)


def allowed(objects: list[dict[str, Any]], src: tuple[dict[str, str] | None, str],
            dst: tuple[dict[str, str] | None, dict[str, Any] | None, str | None],
            port: int) -> bool:
    """Whether a TCP connection passes both the source's egress and the target's ingress.

    ``src``: (pod labels or None for outside, namespace); ``dst``: (pod labels, container for
    named ports, or None with an ip: "in-block" for an address inside an ipBlock).
    """
    policies = of_kind(objects, "NetworkPolicy")
    src_labels, src_ns = src
    dst_labels, dst_container, dst_ip = dst

    def ports_match(rule: dict[str, Any]) -> bool:
        numbers = [p["port"] if isinstance(p["port"], int) or dst_container is None
                   else port_number(dst_container, p["port"]) for p in rule.get("ports", [])]
        return not numbers or port in numbers

    if src_labels is not None and src_ns == "framefleet":
        rules = [r for p in policies if "Egress" in p["spec"]["policyTypes"]
                 and selects(p["spec"]["podSelector"], src_labels)
                 for r in p["spec"].get("egress", [])]
        if not any(ports_match(r) and any(peer_allows(peer, dst_labels, "framefleet", dst_ip)
                                           for peer in r.get("to", [])) for r in rules):
            return False
    if dst_labels is not None:
        rules = [r for p in policies if "Ingress" in p["spec"]["policyTypes"]
                 and selects(p["spec"]["podSelector"], dst_labels)
                 for r in p["spec"].get("ingress", [])]
        return any(ports_match(r) and any(peer_allows(peer, src_labels, src_ns, None)
                                          for peer in r.get("from", [])) for r in rules)
    return True
