#!/usr/bin/env python3
"""Packs the filter into an OCI image in the "compat" Wasm image format, with
no Docker daemon: one layer holding `plugin.wasm`, and the manifest annotation
`module.wasm.image/variant=compat` (the format Istio's WasmPlugin and Envoy
Gateway's EnvoyExtensionPolicy pull).

    tools/oci_image.py build WASM LAYOUT_DIR TAG   writes an OCI image layout,
                                                   prints the manifest digest
    tools/oci_image.py pin LAYOUT_DIR TAG FILE...  writes that digest into the
                                                   manifests' sha256 fields
    tools/oci_image.py check LAYOUT_DIR TAG FILE...  fails if any is stale

The build is reproducible: the same wasm bytes give the same digest (fixed
timestamps, owner and permissions; gzip without name or time), so manifests
can quote it. Push with e.g.
    skopeo copy oci:build/oci:0.1.0 docker://REGISTRY/adaptive-hedge:0.1.0
"""

import gzip
import hashlib
import io
import json
import os
import re
import sys
import tarfile

VARIANT = {"module.wasm.image/variant": "compat"}
EPOCH = "1970-01-01T00:00:00Z"


def blob(layout, data):
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(layout, "blobs", "sha256", digest)
    with open(path, "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def layer_tar(wasm):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("plugin.wasm")
        info.size, info.mode, info.mtime = len(wasm), 0o644, 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(wasm))
    return out.getvalue()


def build(wasm_path, layout, tag):
    with open(wasm_path, "rb") as f:
        wasm = f.read()
    if not wasm.startswith(b"\0asm"):
        sys.exit(f"{wasm_path}: not a wasm module")
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
    tar = layer_tar(wasm)
    gz = gzip.compress(tar, compresslevel=9, mtime=0)
    layer = dict(mediaType="application/vnd.oci.image.layer.v1.tar+gzip", **blob(layout, gz))
    config = {
        "created": EPOCH,
        "architecture": "wasm",
        "os": "wasi",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]},
        "history": [{"created": EPOCH, "created_by": "tools/oci_image.py: plugin.wasm"}],
    }
    config_desc = dict(
        mediaType="application/vnd.oci.image.config.v1+json",
        **blob(layout, json.dumps(config, sort_keys=True).encode()),
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer],
        "annotations": dict(VARIANT),
    }
    manifest_desc = dict(
        mediaType="application/vnd.oci.image.manifest.v1+json",
        **blob(layout, json.dumps(manifest, sort_keys=True).encode()),
    )
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [manifest_desc]}
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump(index, f, sort_keys=True)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return manifest_desc["digest"]


def digest_of(layout, tag):
    with open(os.path.join(layout, "index.json")) as f:
        for m in json.load(f)["manifests"]:
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
                return m["digest"]
    sys.exit(f"{layout}: no image tagged {tag}")


# A manifest quotes the image digest as `sha256: <64 hex>` (Istio WasmPlugin,
# Envoy Gateway image source) and may pin the URL with `@sha256:<64 hex>`.
SHA_FIELD = re.compile(r"(\bsha256:\s*\"?)([0-9a-f]{64})")
SHA_URL = re.compile(r"(@sha256:)([0-9a-f]{64})")


def pin(layout, tag, files, check_only):
    hex_digest = digest_of(layout, tag).split(":", 1)[1]
    stale = []
    for path in files:
        with open(path) as f:
            text = f.read()
        new = SHA_URL.sub(lambda m: m.group(1) + hex_digest, SHA_FIELD.sub(lambda m: m.group(1) + hex_digest, text))
        if new != text:
            stale.append(path)
            if not check_only:
                with open(path, "w") as f:
                    f.write(new)
    if check_only and stale:
        sys.exit(f"stale image digest in {', '.join(stale)} (image is sha256:{hex_digest}): run `make oci-pin`")
    print(f"sha256:{hex_digest} " + ("checked in" if check_only else "pinned in") + f" {len(files)} file(s)")


def main(argv):
    if len(argv) == 4 and argv[0] == "build":
        print(build(argv[1], argv[2], argv[3]))
    elif len(argv) >= 4 and argv[0] in ("pin", "check"):
        pin(argv[1], argv[2], argv[3:], argv[0] == "check")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
