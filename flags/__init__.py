"""absl flag definitions: one module per entry point (`train`, `evaluate`), shared ones in
`common`. Only these modules, the entry points and export's CLI read flags; the library takes
plain arguments. Importing a module defines its flags."""
