"""What both sides import: records, the batch split, device rules, NVML telemetry. Imports only dtwork.errors."""
