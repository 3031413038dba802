"""Parse a CR dict once into the typed model (pure): the schema, the CR's own name, the operator's defaults.

cr = parse_cr(obj)                       # SpecError (camelCase field paths) when the schema or the name is bad
valid = validation.validate(cr)          # then every check of the spec, once
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic

from hpd_operator.api import constants as c
from hpd_operator.api.models import HybridPDDeployment, with_default_images, with_default_pod_monitor_labels
from hpd_operator.api.rules import violations
from hpd_operator.errors import SpecError


def parse_cr(
    obj: dict[str, Any],
    *,
    vllm_image: str = c.VLLM_IMAGE_TEMPLATE,
    router_image: str = c.DEFAULT_ROUTER_IMAGE,
    pod_monitor_labels: Mapping[str, str] | None = None,
    vllm_digests: Mapping[str, str] | None = None,
) -> HybridPDDeployment:
    """Parse one CR dict; schema errors become a SpecError with camelCase field paths. Images the CR leaves out
    become the given defaults (the operator passes its `--vllm-image/--router-image`), and its
    `--pod-monitor-label`s go under the CR's own spec.monitoring.labels; `vllm_digests` (`--vllm-image-digest`) pins
    the default vLLM image of a version it names."""
    try:
        cr = HybridPDDeployment.model_validate(obj)
    except pydantic.ValidationError as err:
        raise SpecError.from_validation_error(err, prefix="") from None
    problems = violations("root", cr, "")  # metadata.name; the spec's checks run in validation.validate
    if problems:
        raise SpecError(problems)
    image_set = isinstance(obj.get("spec"), dict) and obj["spec"].get("image") is not None
    cr = with_default_images(
        cr, vllm_image=vllm_image, router_image=router_image, image_set=image_set, vllm_digests=vllm_digests
    )
    return with_default_pod_monitor_labels(cr, pod_monitor_labels or {})
