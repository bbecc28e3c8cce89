"""Result records shared by gradcheck, optcheck and the MNIST run, and their renderings."""

from reports.record import Result, exit_status
from reports.table import render_table

__all__ = ["Result", "exit_status", "render_table"]
