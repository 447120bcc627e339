"""CPU side of measurement: measurement documents, the predicted-vs-measured gate, the calibration
fit and plans made with a calibration. Imports numpy, scipy and the planner only (no torch), so
`spectune check` runs on a CPU-only install.

Modules: measure (the spectune.measurement/v1 document and its validation), check (the CI gate:
re-predict every committed measurement), fit (the calibration fit: a Calibration from executor
measurements), microbench (closed-form rates from micro-benchmark rows, for the GPU cost-model
benchmark), planned (plan tables made with a calibration).
"""

from spectune.validate.check import check_folder, format_check
from spectune.validate.fit import fit_calibration
from spectune.validate.measure import measurement_doc, validate_measurement
from spectune.validate.planned import plan_table

__all__ = [
    "check_folder",
    "fit_calibration",
    "format_check",
    "measurement_doc",
    "plan_table",
    "validate_measurement",
]
