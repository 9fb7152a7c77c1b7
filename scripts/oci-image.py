#!/usr/bin/env python3
"""Writes a one-layer OCI image archive (an OCI image layout in a tar) without Docker.

    oci-image.py OUT.tar NAME [--entrypoint PATH] [--cmd ARG]... [--user UID:GID] [--env K=V]...
                 [--file SRC:DEST]... [--libs-of DEST]... [--dir DEST:MODE:UID]...
                 [--symlink DEST:TARGET]...

--file copies a host file into the image; --libs-of adds the shared libraries (and the dynamic
loader) that `ldd` names for an image file, at the same paths, so a dynamically linked binary
runs in an image with no distribution in it. The archive names the image NAME (fully qualified,
e.g. localhost/podlock:0.1.0) for `ctr images import`. Files are owned by root, timestamps are
zero: the same inputs give the same image digest.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile


def ldd_paths(path):
    """The libraries and loader ldd names for PATH (none for a static binary)."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True)
    paths = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if "=>" in parts:
            target = parts[parts.index("=>") + 1]
            if target.startswith("/"):
                paths.append(target)
        elif parts and parts[0].startswith("/"):
            paths.append(parts[0])  # the loader, e.g. /lib64/ld-linux-x86-64.so.2
    return paths


def add_dirs(tar, seen, path):
    """Adds PATH's parent directories (root-owned, 0755) once each."""
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d)
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)


def layer(args):
    """The layer's tar bytes."""
    buf = io.BytesIO()
    seen = set()
    files = [tuple(f.split(":", 1)) for f in args.file]
    for dest in args.libs_of:
        src = dict((d, s) for s, d in files)[dest]
        files += [(lib, lib) for lib in ldd_paths(src) if (lib, lib) not in files]
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for spec in args.dir:
            dest, mode, uid = spec.split(":")
            add_dirs(tar, seen, dest + "/x")
            info = tarfile.TarInfo(dest.strip("/"))
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, int(mode, 8), int(uid), int(uid)
            tar.addfile(info)
        for spec in args.symlink:
            dest, target = spec.split(":", 1)
            add_dirs(tar, seen, dest)
            info = tarfile.TarInfo(dest.strip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for src, dest in files:
            add_dirs(tar, seen, dest)
            with open(os.path.realpath(src), "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(dest.strip("/"))
            info.size, info.mode = len(data), os.stat(src).st_mode & 0o777
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def blob(out, data, media_type):
    """Adds DATA as a blob of OUT; returns its descriptor."""
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("name")
    p.add_argument("--entrypoint")
    p.add_argument("--cmd", action="append", default=[])
    p.add_argument("--user", default="")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--libs-of", action="append", default=[])
    p.add_argument("--dir", action="append", default=[])
    p.add_argument("--symlink", action="append", default=[])
    args = p.parse_args()

    raw = layer(args)
    packed = gzip.compress(raw, mtime=0)
    env = ["PATH=/usr/local/bin:/usr/bin:/bin"] + args.env
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"User": args.user, "Env": env, "Entrypoint": [args.entrypoint] if args.entrypoint else None,
                   "Cmd": args.cmd or None, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
        "history": [{"created_by": "scripts/oci-image.py"}],
    }
    with tarfile.open(args.out, "w") as out:
        layer_desc = blob(out, packed, "application/vnd.oci.image.layer.v1.tar+gzip")
        config_desc = blob(out, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": config_desc, "layers": [layer_desc]}
        manifest_desc = blob(out, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
        manifest_desc["annotations"] = {"io.containerd.image.name": args.name,
                                        "org.opencontainers.image.ref.name": args.name.rsplit(":", 1)[-1]}
        manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
        for name, data in [("oci-layout", {"imageLayoutVersion": "1.0.0"}),
                           ("index.json", {"schemaVersion": 2, "manifests": [manifest_desc]})]:
            text = json.dumps(data).encode()
            info = tarfile.TarInfo(name)
            info.size = len(text)
            out.addfile(info, io.BytesIO(text))
    print(f"{args.name}: {len(packed) / 1e6:.1f} MB compressed, {manifest_desc['digest']}", file=sys.stderr)


if __name__ == "__main__":
    main()
