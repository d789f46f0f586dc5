"""Write gpu_provider/spend/prices.json, the price table shipped with the provider.

The us-east-1 figures below are AWS's public On-Demand prices (EC2: Linux, shared tenancy; SageMaker:
training instances) for the GPU/accelerator families this provider prices. Regions other than
us-east-1, and SageMaker types without a figure of their own, are derived by the factors in
``DERIVED`` (stated in the file's ``notes``). Run ``python scripts/price_table.py`` after editing.
Families marked in ``APPROXIMATE`` had no published figure at hand when the table was written;
override them in ``[gpu_provider] prices`` or enable live prices if you run them.
"""

from __future__ import annotations

import json
from pathlib import Path

RETRIEVED = "2026-12-03"
SOURCE = (
    "AWS public On-Demand price pages: https://aws.amazon.com/ec2/pricing/on-demand/ (Linux, shared tenancy) and "
    "https://aws.amazon.com/sagemaker/pricing/ (training), us-east-1"
)

#: instance type: (accelerators per instance, accelerator, us-east-1 EC2 USD per hour)
EC2 = {
    "g4dn.xlarge": (1, "t4", 0.526),
    "g4dn.2xlarge": (1, "t4", 0.752),
    "g4dn.4xlarge": (1, "t4", 1.204),
    "g4dn.8xlarge": (1, "t4", 2.176),
    "g4dn.12xlarge": (4, "t4", 3.912),
    "g4dn.16xlarge": (1, "t4", 4.352),
    "g4dn.metal": (8, "t4", 7.824),
    "g5.xlarge": (1, "a10g", 1.006),
    "g5.2xlarge": (1, "a10g", 1.212),
    "g5.4xlarge": (1, "a10g", 1.624),
    "g5.8xlarge": (1, "a10g", 2.448),
    "g5.12xlarge": (4, "a10g", 5.672),
    "g5.16xlarge": (1, "a10g", 4.096),
    "g5.24xlarge": (4, "a10g", 8.144),
    "g5.48xlarge": (8, "a10g", 16.288),
    "g6.xlarge": (1, "l4", 0.8048),
    "g6.2xlarge": (1, "l4", 0.9776),
    "g6.4xlarge": (1, "l4", 1.3232),
    "g6.8xlarge": (1, "l4", 2.0144),
    "g6.12xlarge": (4, "l4", 4.6016),
    "g6.16xlarge": (1, "l4", 3.3968),
    "g6.24xlarge": (4, "l4", 6.6752),
    "g6.48xlarge": (8, "l4", 13.3504),
    "g6e.xlarge": (1, "l40s", 1.861),
    "g6e.2xlarge": (1, "l40s", 2.24208),
    "g6e.4xlarge": (1, "l40s", 3.00424),
    "g6e.8xlarge": (1, "l40s", 4.52856),
    "g6e.12xlarge": (4, "l40s", 10.49264),
    "g6e.16xlarge": (1, "l40s", 7.57719),
    "g6e.24xlarge": (4, "l40s", 15.06559),
    "g6e.48xlarge": (8, "l40s", 30.13118),
    "p3.2xlarge": (1, "v100", 3.06),
    "p3.8xlarge": (4, "v100", 12.24),
    "p3.16xlarge": (8, "v100", 24.48),
    "p4d.24xlarge": (8, "a100", 32.7726),
    "p4de.24xlarge": (8, "a100-80gb", 40.96575),
    "p5.48xlarge": (8, "h100", 55.04),
    "p5e.48xlarge": (8, "h200", 63.296),
    "p6-b200.48xlarge": (8, "b200", 113.9328),
    "trn1.2xlarge": (1, "trn1", 1.34375),
    "trn1.32xlarge": (16, "trn1", 21.50),
    "inf2.xlarge": (1, "inf2", 0.75785),
    "inf2.8xlarge": (1, "inf2", 1.96786),
    "inf2.24xlarge": (6, "inf2", 6.49063),
    "inf2.48xlarge": (12, "inf2", 12.98127),
}

#: SageMaker training figures of their own (us-east-1); other ml. types: EC2 x SAGEMAKER_FACTOR
SAGEMAKER = {
    "ml.g4dn.xlarge": 0.736,
    "ml.g4dn.2xlarge": 0.94,
    "ml.g4dn.4xlarge": 1.505,
    "ml.g4dn.8xlarge": 2.72,
    "ml.g4dn.12xlarge": 4.89,
    "ml.g4dn.16xlarge": 5.44,
    "ml.g5.xlarge": 1.408,
    "ml.g5.2xlarge": 1.515,
    "ml.g5.4xlarge": 2.03,
    "ml.g5.8xlarge": 3.06,
    "ml.g5.12xlarge": 7.09,
    "ml.g5.16xlarge": 5.12,
    "ml.g5.24xlarge": 10.18,
    "ml.g5.48xlarge": 20.36,
    "ml.p3.2xlarge": 3.825,
    "ml.p3.8xlarge": 14.688,
    "ml.p3.16xlarge": 28.152,
    "ml.p4d.24xlarge": 37.688,
    "ml.trn1.2xlarge": 1.54,
    "ml.trn1.32xlarge": 24.725,
}
SAGEMAKER_FACTOR = 1.25
#: region: factor on the us-east-1 figure
REGIONS = {"us-east-1": 1.0, "us-west-2": 1.0, "eu-west-1": 1.10}
APPROXIMATE = ["p5e", "p6-b200"]
DERIVED = [
    "us-west-2 figures equal us-east-1 (AWS prices these families alike in both)",
    "eu-west-1 figures are us-east-1 x 1.10 (the usual EU premium for these families), rounded to 4 decimals",
    f"ml. types without a figure above are the EC2 figure x {SAGEMAKER_FACTOR} (SageMaker's usual premium)",
    "families in 'approximate' had no published figure at hand: override them or enable live prices",
]


def build() -> dict[str, object]:
    instances: dict[str, dict[str, object]] = {}
    base: dict[str, float] = {}
    for itype, (count, accel, usd) in EC2.items():
        instances[itype] = {"accelerators": count, "accelerator": accel}
        instances["ml." + itype] = {"accelerators": count, "accelerator": accel}
        base[itype] = usd
        base["ml." + itype] = SAGEMAKER.get("ml." + itype, usd * SAGEMAKER_FACTOR)
    regions = {
        region: {itype: round(usd * factor, 4) for itype, usd in sorted(base.items())}
        for region, factor in REGIONS.items()
    }
    return {
        "source": SOURCE,
        "retrieved": RETRIEVED,
        "currency": "USD",
        "unit": "instance-hour, On-Demand",
        "notes": DERIVED,
        "approximate": APPROXIMATE,
        "instances": dict(sorted(instances.items())),
        "on_demand": regions,
    }


if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "gpu_provider" / "spend" / "prices.json"
    out.write_text(json.dumps(build(), indent=1, sort_keys=False) + "\n")
    print(f"wrote {out}")
