"""``kvpilot render -f isvc.yaml``: the Deployment and Service (or LeaderWorkerSet) the operator would
apply for each InferenceService in the file."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from kvpilot.cli.inputs import EXIT_OK, CliError, read_text


def run_render(args: argparse.Namespace, out: TextIO) -> int:
    import yaml

    try:
        documents = [d for d in yaml.safe_load_all(read_text(args.file)) if d is not None]
    except yaml.YAMLError as exc:
        raise CliError(f"{args.file} is not valid YAML: {exc}") from None
    if not documents or not all(isinstance(d, dict) for d in documents):
        raise CliError(f"{args.file} must hold one or more InferenceService manifests")
    from kvpilot.operator.inferenceservice import render

    manifests: list[dict[str, Any]] = []
    for document in documents:
        try:
            manifests += render.build_manifests(document, gpu_product=args.gpu)
        except render.RenderError as exc:
            raise CliError(f"{exc.reason}: {exc.message}") from None

    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # shared label dicts print in full, not as &id001
            return True

    if any(m.get("kind") == "LeaderWorkerSet" for m in manifests):
        out.write(
            "# gpu.nodesPerReplica > 1: the operator applies this LeaderWorkerSet where the cluster serves\n"
            "# leaderworkerset.x-k8s.io/v1 (else Ready=False, LeaderWorkerSetNotInstalled).\n"
        )
    yaml.dump_all(manifests, out, Dumper=NoAliases, sort_keys=False)
    return EXIT_OK


# -- diagnose -------------------------------------------------------------------------------------
