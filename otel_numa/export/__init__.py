"""The export layer: the MeterProvider, its readers and exporters (the public path), and the optional
accelerator over them (:mod:`otel_numa.export.fast`)."""
