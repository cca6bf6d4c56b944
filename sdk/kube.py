"""Per-action Kubernetes options, checked once for the CLI and the SDK (issue #22).

``kube_options(...)`` turns what a user gives (``KEY=VALUE`` strings or mappings,
toleration and volume strings, a quantity for ``/dev/shm``) into the wire's
:class:`~headway.protocol.KubeOptions`, or raises ValueError naming the field and the
value. The CLI names its flags (``--label``), the SDK its keyword arguments (``labels``):
the ``names`` argument says which.

Syntax (the same in both):

- env ``NAME=VALUE``; a Secret ``SECRET`` (every key, ``envFrom``) or ``SECRET:KEY``
  (the variable ``KEY`` from that key);
- labels, annotations, node selector ``KEY=VALUE`` (Kubernetes key syntax; Headway's own
  ``headway.io/`` keys are refused);
- toleration ``KEY[=VALUE][:EFFECT]`` (no value: ``Exists``; effect one of
  ``NoSchedule``, ``PreferNoSchedule``, ``NoExecute``, none: every effect) or ``:EFFECT``
  / ``*`` for every taint;
- volume ``pvc:CLAIM:/mount/path[:ro]``, ``configmap:NAME:/path``, ``secret:NAME:/path``
  or ``emptydir:/path``;
- ``shm_size`` a memory quantity (``8Gi``): a memory-backed ``/dev/shm`` of that size.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from headway.protocol import KubeOptions, SecretEnv, Toleration, Volume
from headway.scheduler.resources import QuantityError, parse_memory

__all__ = ["CLI_NAMES", "SDK_NAMES", "kube_options"]

_NAME63 = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_KEY = re.compile(r"^[-._A-Za-z0-9]+$")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
VOLUME_KINDS = ("pvc", "configmap", "secret", "emptydir")
#: Headway's own label and annotation keys: an action may not set them.
RESERVED_PREFIX = "headway.io/"

#: Field -> how the CLI names it (its flag).
CLI_NAMES = {
    "args": "--arg",
    "env": "--env",
    "env_from_secrets": "--env-from-secret",
    "labels": "--label",
    "annotations": "--annotation",
    "tolerations": "--toleration",
    "node_selector": "--node-selector",
    "priority_class": "--priority-class",
    "service_account": "--service-account",
    "volumes": "--volume",
    "shm_size": "--shm-size",
}
#: Field -> how the SDK names it (its keyword argument).
SDK_NAMES = {**{k: k for k in CLI_NAMES}, "env_from_secrets": "secrets", "env": "env_vars"}


class _Bad(ValueError):
    pass


def _bad(name: str, value: Any, why: str) -> _Bad:
    return _Bad(f"{name}: {value!r} {why}")


def _qualified_key(key: str, name: str, value: Any, *, reserved: bool = True) -> None:
    """A label/annotation key: ``[prefix/]name``, prefix a DNS subdomain."""
    prefix, _, base = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        raise _bad(name, value, f"has a bad key prefix {prefix!r} (a DNS subdomain)")
    if not _NAME63.match(base):
        raise _bad(
            name,
            value,
            "has a bad key (at most 63 letters, digits, '-', '_', '.', starting and ending"
            " alphanumeric, after an optional 'prefix/')",
        )
    if reserved and key.startswith(RESERVED_PREFIX):
        raise _bad(name, value, f"uses Headway's own key prefix {RESERVED_PREFIX!r}")


def _pairs(given: Mapping[str, str] | Iterable[str] | None, name: str) -> dict[str, str]:
    """``KEY=VALUE`` strings (or a mapping) as a dict; a repeated key is refused."""
    if given is None:
        return {}
    if isinstance(given, Mapping):
        items = [(str(k), v, f"{k}={v}") for k, v in given.items()]
    else:
        items = []
        for text in given:
            if not isinstance(text, str) or "=" not in text:
                raise _bad(name, text, "is not KEY=VALUE")
            key, _, value = text.partition("=")
            items.append((key, value, text))
    out: dict[str, str] = {}
    for key, value, text in items:
        if not isinstance(value, str):
            raise _bad(name, text, "has a value that is not a string")
        if key in out:
            raise _bad(name, text, f"sets {key!r} twice")
        out[key] = value
    return out


def _labels(given: Any, name: str, *, values_are_labels: bool = True) -> dict[str, str]:
    out = _pairs(given, name)
    for key, value in out.items():
        _qualified_key(key, name, f"{key}={value}")
        if values_are_labels and value and not _NAME63.match(value):
            raise _bad(
                name,
                f"{key}={value}",
                "has a bad value (at most 63 letters, digits, '-', '_', '.', starting and"
                " ending alphanumeric)",
            )
    return out


def _env(given: Any, name: str) -> dict[str, str]:
    out = _pairs(given, name)
    for key, value in out.items():
        if not _ENV_NAME.match(key):
            raise _bad(name, f"{key}={value}", "names no valid variable ([A-Za-z_][A-Za-z0-9_]*)")
    return out


def _secret(text: Any, name: str) -> SecretEnv:
    if isinstance(text, SecretEnv):
        text = text.secret if text.key is None else f"{text.secret}:{text.key}"
    if not isinstance(text, str):
        raise _bad(name, text, "is not SECRET or SECRET:KEY")
    secret, sep, key = text.partition(":")
    if len(secret) > 253 or not _SUBDOMAIN.match(secret):
        raise _bad(
            name, text, "names no valid Secret (a DNS subdomain: lower-case, digits, '-', '.')"
        )
    if not sep:
        return SecretEnv(secret)
    if not _SECRET_KEY.match(key) or not _ENV_NAME.match(key):
        raise _bad(
            name, text, "has a key that is no variable name (SECRET:KEY sets the variable KEY)"
        )
    return SecretEnv(secret, key)


def _toleration(text: Any, name: str) -> Toleration:
    if isinstance(text, Toleration):
        return text
    if not isinstance(text, str) or not text:
        raise _bad(name, text, "is not KEY[=VALUE][:EFFECT]")
    if text == "*":
        return Toleration()
    head, sep, effect = text.rpartition(":") if ":" in text else (text, "", "")
    if sep and effect not in EFFECTS:
        raise _bad(name, text, f"has effect {effect!r}, not one of {', '.join(EFFECTS)}")
    if not head:
        return Toleration(effect=effect)
    key, eq, value = head.partition("=")
    _qualified_key(key, name, text, reserved=False)
    if eq:
        if value and not _NAME63.match(value):
            raise _bad(name, text, "has a bad value (a label value)")
        return Toleration(key=key, operator="Equal", value=value, effect=effect)
    return Toleration(key=key, operator="Exists", effect=effect)


def _volume(text: Any, name: str) -> Volume:
    if isinstance(text, Volume):
        text = (
            f"emptydir:{text.mount_path}"
            if text.kind == "emptydir"
            else f"{text.kind}:{text.source}:{text.mount_path}{':ro' if text.read_only else ''}"
        )
    if not isinstance(text, str):
        raise _bad(name, text, "is not KIND:NAME:/PATH[:ro]")
    parts = text.split(":")
    kind = parts[0]
    if kind not in VOLUME_KINDS:
        raise _bad(name, text, f"has kind {kind!r}, not one of {', '.join(VOLUME_KINDS)}")
    read_only = len(parts) > 1 and parts[-1] == "ro"
    rest = parts[1:-1] if read_only else parts[1:]
    if kind == "emptydir":
        if len(rest) != 1:
            raise _bad(name, text, "is not emptydir:/PATH")
        source, path = "", rest[0]
    else:
        if len(rest) != 2:
            raise _bad(name, text, f"is not {kind}:NAME:/PATH[:ro]")
        source, path = rest
        if len(source) > 253 or not _SUBDOMAIN.match(source):
            raise _bad(name, text, f"names no valid {kind} (a DNS subdomain)")
    if not path.startswith("/") or path == "/dev/shm":
        raise _bad(name, text, "needs an absolute mount path (not /dev/shm: see shm size)")
    return Volume(kind, source, path, read_only)


def _object_name(value: Any, name: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 253 or not _SUBDOMAIN.match(value):
        raise _bad(
            name, value, "is not a valid name (a DNS subdomain: lower-case, digits, '-', '.')"
        )
    return value


def _list(given: Any) -> list[Any]:
    if given is None:
        return []
    if isinstance(given, str):
        return [given]
    return list(given)


def kube_options(
    *,
    args: Iterable[str] | None = None,
    env: Mapping[str, str] | Iterable[str] | None = None,
    env_from_secrets: Iterable[str | SecretEnv] | str | None = None,
    labels: Mapping[str, str] | Iterable[str] | None = None,
    annotations: Mapping[str, str] | Iterable[str] | None = None,
    tolerations: Iterable[str | Toleration] | str | None = None,
    node_selector: Mapping[str, str] | Iterable[str] | None = None,
    priority_class: str | None = None,
    service_account: str | None = None,
    volumes: Iterable[str | Volume] | str | None = None,
    shm_size: str | int | None = None,
    names: Mapping[str, str] = SDK_NAMES,
) -> KubeOptions | None:
    """The checked options, or None when none is given.

    Raises:
        ValueError: a bad value, as ``<field>: <value> <why>`` (the field as ``names``
            calls it).
    """
    arg_list = _list(args)
    for a in arg_list:
        if not isinstance(a, str):
            raise _bad(names["args"], a, "is not a string")
    shm: int | None = None
    if shm_size is not None:
        try:
            shm = parse_memory(shm_size, names["shm_size"])
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
        if shm <= 0:
            raise _bad(names["shm_size"], shm_size, "must be more than 0")
    opts = KubeOptions(
        args=arg_list,
        env=_env(env, names["env"]),
        env_from_secrets=[_secret(s, names["env_from_secrets"]) for s in _list(env_from_secrets)],
        labels=_labels(labels, names["labels"]),
        annotations=_labels(annotations, names["annotations"], values_are_labels=False),
        tolerations=[_toleration(t, names["tolerations"]) for t in _list(tolerations)],
        node_selector=_labels(node_selector, names["node_selector"]),
        priority_class=_object_name(priority_class, names["priority_class"]),
        service_account=_object_name(service_account, names["service_account"]),
        volumes=[_volume(v, names["volumes"]) for v in _list(volumes)],
        shm_size=shm,
    )
    paths = [v.mount_path for v in opts.volumes]
    for path in paths:
        if paths.count(path) > 1:
            raise _bad(names["volumes"], path, "is mounted twice")
    return None if opts == KubeOptions() else opts
