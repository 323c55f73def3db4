"""The operator's command line: click commands over the operator API, its client, text
rendering and the generated CLI reference."""
