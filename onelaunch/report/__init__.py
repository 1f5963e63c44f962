"""Reporting: results files, the ladder file's rows, figures and widgets in one style,
and the helpers the chapters share. Reads measured rows; measures nothing."""
