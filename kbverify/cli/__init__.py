"""The command line: the typer app (`app`), what each command does end to end (`jobs`, `build_corpus`), and the checks
of its options and paths (`validate`, `validate_paths`). Side: parent. The top layer: it may import every other
package, and none imports it."""
