"""The analysis commands run from the kernel (scaling, throughput, tune, GNS advice), doctor, script export. May import everything below the entry points."""
