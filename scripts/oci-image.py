#!/usr/bin/env python3
"""Writes a one-layer OCI image (an image-layout tarball) from a directory.

No registry is reachable here and no Docker engine runs, so the node's images
(scripts/node.sh) are made from files on this machine and imported into
containerd with `ctr images import`. The output is reproducible: entries are
sorted, owned by root, dated at the epoch, and gzip carries no timestamp, so
the same inputs give the same digests.

  scripts/oci-image.py --out pause.tar --name localhost/targetlease/pause:local \
      --rootfs DIR --entrypoint '["/pause"]' [--cmd JSON] [--user 65535:65535] \
      [--env K=V]... [--workdir /] [--label K=V]...
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX = "application/vnd.oci.image.index.v1+json"


def layer_tar(rootfs):
    """The rootfs as an uncompressed tar, deterministic."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = []
        for top, dirs, files in os.walk(rootfs):
            dirs.sort()
            for name in sorted(dirs + files):
                paths.append(os.path.join(top, name))
        for path in sorted(paths, key=lambda p: os.path.relpath(p, rootfs)):
            rel = os.path.relpath(path, rootfs)
            info = tar.gettarinfo(path, arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.pax_headers = {}
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True, help="image reference, e.g. localhost/x/y:tag")
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--entrypoint", default="null", help="JSON list")
    ap.add_argument("--cmd", default="null", help="JSON list")
    ap.add_argument("--user", default="")
    ap.add_argument("--workdir", default="/")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--label", action="append", default=[])
    args = ap.parse_args()

    if not os.path.isdir(args.rootfs):
        sys.exit(f"oci-image: {args.rootfs} is not a directory")
    raw = layer_tar(args.rootfs)
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as f:
        f.write(raw)
    layer = gz.getvalue()

    env = args.env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": env,
            "WorkingDir": args.workdir,
            "Labels": dict(kv.split("=", 1) for kv in args.label) or None,
        },
        "rootfs": {"type": "layers", "diff_ids": [sha256(raw)]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "scripts/oci-image.py"}],
    }
    for key, value in (("Entrypoint", json.loads(args.entrypoint)), ("Cmd", json.loads(args.cmd))):
        if value is not None:
            config["config"][key] = value
    if args.user:
        config["config"]["User"] = args.user
    config["config"] = {k: v for k, v in config["config"].items() if v is not None}
    config_blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()

    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": sha256(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": LAYER, "digest": sha256(layer), "size": len(layer)}],
    }
    manifest_blob = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    tag = args.name.rsplit(":", 1)[1] if ":" in args.name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [{
            "mediaType": MANIFEST,
            "digest": sha256(manifest_blob),
            "size": len(manifest_blob),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "io.containerd.image.name": args.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }
    files = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True, separators=(",", ":")).encode()),
    ]
    for blob in (config_blob, manifest_blob, layer):
        files.append(("blobs/sha256/" + sha256(blob).split(":", 1)[1], blob))

    tmp = args.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, args.out)
    print(f"oci-image: {args.name} -> {args.out} ({len(layer)} bytes compressed, {sha256(manifest_blob)})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
