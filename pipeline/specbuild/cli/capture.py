"""``specbuild capture show`` and ``purge``: a capture store, described or deleted (the API:
:mod:`specbuild.capture.inventory`). Neither prints anything of the traffic itself."""

from __future__ import annotations

from pathlib import Path

import click

from specbuild.cli.common import console, json_option, main, print_json, reports_errors


@main.group("capture")
def capture() -> None:
    """A capture store: what a release with capture.enabled wrote of its traffic (token ids: the text)."""


@capture.command("show")
@click.argument("directory", type=click.Path(file_okay=False))
@json_option
@reports_errors
def show(directory: str, json_mode: bool) -> None:
    """The capture store DIRECTORY: its files, records, bytes, time window and the releases that wrote them."""
    from specbuild.capture.inventory import summarize

    summary = summarize(Path(directory))
    if json_mode:
        print_json(summary.to_dict())
        return
    data = summary.to_dict()
    console.print(f"{data['folder']}: {summary.files} files, {summary.records} records, {summary.bytes} bytes",
                  highlight=False, soft_wrap=True)
    if summary.records:
        console.print(f"  from {data['first']} to {data['last']}", highlight=False)
    for release, count in summary.releases.items():
        console.print(f"  release {release}: {count} records", highlight=False)


@capture.command("purge")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--older-than", "older_than", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="DAYS", help="only the files last written more than DAYS days ago  [default: every file]")
@click.option("--yes", is_flag=True, help="delete without asking")
@json_option
@reports_errors
def purge(directory: str, older_than: float | None, yes: bool, json_mode: bool) -> None:
    """Delete the capture files of the store DIRECTORY (asks first unless --yes). A folder that is not a capture
    store is refused; a server still capturing there goes on in a new file."""
    from specbuild.capture.inventory import purge_candidates
    from specbuild.capture.store import delete_files

    candidates = purge_candidates(Path(directory), older_than)
    size = sum(path.stat().st_size for path in candidates)
    if candidates and not yes:
        click.confirm(f"delete {len(candidates)} capture files ({size} bytes) from {directory}?", abort=True,
                      err=True)
    deleted = delete_files(candidates)
    if json_mode:
        print_json({"folder": str(Path(directory).absolute()), "deleted": [str(path) for path in deleted],
                    "bytes": size})
    else:
        console.print(f"deleted {len(deleted)} capture files ({size} bytes) from {directory}", highlight=False,
                      soft_wrap=True)
