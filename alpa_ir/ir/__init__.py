"""The IR's text (parse, print, verify), tensor types, context and shared accessors (import alpa_ir.ir)."""
