"""Who owns a container: ask the container runtime over its Unix socket, cache the answer.

A process inside a container usually runs as root on the host, so its uid says nothing about
who started it. The agent asks the runtime's Docker Engine API (Docker's
``/var/run/docker.sock``; Podman's compatible ``/run/podman/podman.sock``) for
``GET /containers/{id}/json`` and reads the owner from, in this order:

1. the owner label (``org.gpuroster.user`` by default; ``gpuroster env --docker`` prints it);
2. the lab's name rule: a regular expression with a named group ``user`` matched against the
   container's name (``^(?P<user>[a-z_][a-z0-9_-]*)-`` reads ``alice-train`` as alice);
3. the lab's compose rule: the same kind of expression matched against the compose project
   label ``com.docker.compose.project`` (Kubernetes pods run through a Docker-API runtime
   carry ``io.kubernetes.pod.namespace``, matched by the same rule when the project label
   is absent).

Containers that no Docker-API runtime knows (Kubernetes on containerd or CRI-O) are looked up
in the runtimes' state files where the agent can read them: the OCI ``config.json`` of the
container (containerd: ``/run/containerd/io.containerd.runtime.v2.task/<ns>/<id>/``, CRI-O:
``/run/containers/storage/overlay-containers/<id>/userdata/``), whose annotations carry the
pod's namespace and name, the container's name and image (and, from CRI-O, its labels). The
same rules apply to them: the owner label among the annotations and labels, then the name
rule on the pod name, then the compose rule on the pod namespace.

Answers are cached per container id: a found container for ``ttl`` seconds (labels cannot
change while a container exists), a container no runtime knows for ``negative_ttl`` seconds
(it may just have been created). A poll therefore costs one HTTP request per new container
and none for the ones already seen. No runtime socket at all means no request.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.httpx_lean import httpx  # httpx without its own CLI (click, rich, pygments)

log = logging.getLogger(__name__)

DEFAULT_SOCKETS = (Path("/var/run/docker.sock"), Path("/run/podman/podman.sock"))
CONTAINERD_STATE = Path("/run/containerd/io.containerd.runtime.v2.task")
CRIO_STATE = Path("/run/containers/storage/overlay-containers")
DEFAULT_STATE_DIRS = (CONTAINERD_STATE, CRIO_STATE)
# OCI annotations the CRI runtimes write: (pod namespace, pod name, container name, image)
_CRI_KEYS = (
    ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name", "io.kubernetes.cri.container-name",
     "io.kubernetes.cri.image-name"),
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.container.name",
     "io.kubernetes.cri-o.ImageName"),
)
DEFAULT_OWNER_LABEL = "org.gpuroster.user"
COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
_OWNER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """What the runtime says about one container.

    ``owner``: the Unix name it is attributed to, or ``None`` when no rule names one;
    ``owner_source``: ``label``, ``name`` or ``compose`` (which rule named the owner);
    ``found``: ``False`` when no runtime knows the id (``error`` says why).
    """

    id: str
    name: str | None = None
    image: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    owner: str | None = None
    owner_source: str | None = None
    found: bool = True
    error: str | None = None


def _pattern(text: str | None, what: str) -> re.Pattern[str] | None:
    if not text:
        return None
    pat = re.compile(text)
    if "user" not in pat.groupindex:
        raise ValueError(f"{what} must contain a named group (?P<user>...)")
    return pat


class ContainerDirectory:
    """Container id -> :class:`ContainerInfo`, through the runtimes' sockets, cached.

    :param sockets: Unix sockets speaking the Docker Engine API, asked in order; missing ones
        are skipped.
    :param owner_label: the label naming the owner.
    :param name_pattern: regex with group ``user`` for container names (the lab's rule).
    :param compose_pattern: regex with group ``user`` for the compose project (or pod namespace).
    :param ttl: seconds a found container stays cached; ``negative_ttl`` for an unknown one.
    :param timeout: seconds per request. ``clock``: monotonic seconds (tests advance it).
    :param state_dirs: containerd and CRI-O state directories read for containers no socket knows.
    Raises ``ValueError`` for a pattern without the ``user`` group.
    """

    def __init__(
        self,
        sockets: Sequence[Path] = DEFAULT_SOCKETS,
        *,
        owner_label: str = DEFAULT_OWNER_LABEL,
        name_pattern: str | None = None,
        compose_pattern: str | None = None,
        ttl: float = 600.0,
        negative_ttl: float = 30.0,
        timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        state_dirs: Sequence[Path] = DEFAULT_STATE_DIRS,
    ) -> None:
        self.sockets = [Path(s) for s in sockets]
        self.state_dirs = [Path(d) for d in state_dirs]
        self.owner_label = owner_label
        self.name_pattern = _pattern(name_pattern, "container_name_pattern")
        self.compose_pattern = _pattern(compose_pattern, "container_compose_pattern")
        self.ttl = ttl
        self.negative_ttl = negative_ttl
        self.timeout = timeout
        self.clock = clock
        self._cache: dict[str, tuple[float, ContainerInfo]] = {}
        self._clients: dict[Path, httpx.Client] = {}
        self.requests = 0

    def _client(self, sock: Path) -> httpx.Client:
        c = self._clients.get(sock)
        if c is None:
            c = self._clients[sock] = httpx.Client(
                # Plain HTTP over a Unix socket (the base URL is http://): no TLS is ever spoken, so
                # verify=False only skips loading the CA bundle into an SSL context the client
                # would never use (about 0.8 MiB of RSS per runtime socket).
                transport=httpx.HTTPTransport(uds=str(sock), verify=False), base_url="http://runtime", timeout=self.timeout
            )
        return c

    def lookup(self, container_id: str) -> ContainerInfo:
        """The container ``container_id`` (64 hex), from the cache or the runtimes. Never raises."""
        now = self.clock()
        hit = self._cache.get(container_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        info = self._ask(container_id)
        self._cache[container_id] = (now + (self.ttl if info.found else self.negative_ttl), info)
        if len(self._cache) > 4096:  # forget expired entries of containers long gone
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        return info

    def _ask(self, cid: str) -> ContainerInfo:
        problems: list[str] = []
        for sock in self.sockets:
            if not sock.exists():
                continue
            try:
                self.requests += 1
                r = self._client(sock).get(f"/containers/{cid}/json")
            except httpx.HTTPError as e:
                problems.append(f"{sock}: {type(e).__name__}: {e}")
                continue
            if r.status_code == 404:
                problems.append(f"{sock}: no such container")
                continue
            if r.status_code != 200:
                problems.append(f"{sock}: HTTP {r.status_code}")
                continue
            try:
                return self._parse(cid, r.json())
            except (ValueError, TypeError, AttributeError) as e:
                problems.append(f"{sock}: unreadable answer ({e})")
        from_state = self._from_state(cid)
        if from_state is not None:
            return from_state
        if not problems:
            problems.append("no container runtime socket (" + ", ".join(str(s) for s in self.sockets) + ")")
        detail = "; ".join(problems)
        log.debug("container %s: %s", cid[:12], detail)
        return ContainerInfo(id=cid, found=False, error=detail[:1024])

    def _parse(self, cid: str, body: dict[str, Any]) -> ContainerInfo:
        config = body.get("Config") or {}
        labels = {str(k): str(v) for k, v in (config.get("Labels") or {}).items()}
        name = (body.get("Name") or "").lstrip("/") or None
        image = config.get("Image") or body.get("Image") or None
        owner, source = self.owner_of(name, labels)
        return ContainerInfo(id=cid, name=name, image=image, labels=labels, owner=owner, owner_source=source)

    def _from_state(self, cid: str) -> ContainerInfo | None:
        """The container from containerd's or CRI-O's OCI ``config.json``, or ``None``."""
        candidates: list[Path] = []
        for root in self.state_dirs:
            candidates += [root / cid / "userdata" / "config.json", *root.glob(f"*/{cid}/config.json")]
        for path in candidates:
            try:
                annotations = json.loads(path.read_text(encoding="utf-8")).get("annotations") or {}
            except (OSError, ValueError, AttributeError):
                continue
            if not isinstance(annotations, dict):
                continue
            labels = {str(k): str(v) for k, v in annotations.items()}
            try:
                labels.update({str(k): str(v) for k, v in json.loads(labels.get("io.kubernetes.cri-o.Labels", "{}")).items()})
            except (ValueError, AttributeError):
                pass
            for ns_key, pod_key, name_key, image_key in _CRI_KEYS:
                if ns_key in labels:
                    labels.setdefault(POD_NAMESPACE_LABEL, labels[ns_key])
                    name = labels.get(pod_key) or labels.get(name_key)
                    image = labels.get(image_key)
                    break
            else:
                name, image = None, None
            owner, source = self.owner_of(name, labels)
            return ContainerInfo(id=cid, name=name, image=image, labels=labels, owner=owner, owner_source=source)
        return None

    def owner_of(self, name: str | None, labels: dict[str, str]) -> tuple[str | None, str | None]:
        """``(owner, rule)`` for a container's name and labels; ``(None, None)`` when no rule
        names a well-formed Unix name."""
        value = labels.get(self.owner_label, "").strip()
        if value and _OWNER_NAME.match(value):
            return value, "label"
        for pat, text, source in (
            (self.name_pattern, name, "name"),
            (self.compose_pattern, labels.get(COMPOSE_PROJECT_LABEL) or labels.get(POD_NAMESPACE_LABEL), "compose"),
        ):
            if pat is None or not text:
                continue
            m = pat.search(text)
            user = (m.group("user") or "") if m else ""
            if user and _OWNER_NAME.match(user):
                return user, source
        return None, None

    def close(self) -> None:
        """Close the runtime connections."""
        for c in self._clients.values():
            c.close()
        self._clients.clear()


__all__ = [
    "COMPOSE_PROJECT_LABEL", "ContainerDirectory", "ContainerInfo", "DEFAULT_OWNER_LABEL", "DEFAULT_SOCKETS",
    "DEFAULT_STATE_DIRS",
]
