"""Rebuild a sweep's tables, figures and summary from its `runs.csv` alone.

    python -m experiments.report results/<sweep>

writes into the sweep folder (and lists what it wrote in .report-manifest.json: a rebuild removes only files
listed there, and refuses a runs.csv, tables/, figures/ or summary.md that is a symbolic link, or a summary.md
it did not write):
    summary.md                       what was measured, how it was counted, where it ran; links everything below
    tables/costs.{csv,md,tex}        one row per point: params, GMACs, latency, memory, train step, accuracy, status
    tables/exponents.{csv,md,tex}    fitted scaling exponent k of cost ~ N^k per mixer and metric
    tables/crossovers.{csv,md,tex}   token count where each mixer becomes cheaper than attention(_naive)
    tables/accuracy.{csv,md,tex}     accuracy over seeds (mean, s.d., 95% t interval, n) with params and cost
    tables/reach*.{csv,md,tex}       reach accuracy per direction and distance; buckets that separate two mixers
    tables/erf.{csv,md,tex}          radii holding 50% / 90% of each effective receptive field (with erf/*.npz)
    tables/claims.{csv,md,tex}       with --claims: a paper's claimed factors beside the measured ones, with verdicts
                                     (the manifest records the claims, and a later plain rebuild checks them again)
    figures/wall*.{png,pdf}          latency, memory and GMACs against tokens (training step in wall_train*)
    figures/patch_resolution*        the same N reached by different (image, patch) pairs, with >1 patch size
    figures/accuracy_cost*           accuracy against GMACs and latency, 95% intervals, front of points above chance
    figures/reach*                   accuracy against mark distance, a panel per direction, a line per mixer
    figures/erf*                     effective receptive field maps per mixer, at initialisation and trained
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .build import ReportError, build_report, check_headline_target, claims_to_check, write_headline
from .claims import ClaimsError, load_claims


def main(argv: list[str] | None = None) -> int:
    """Command line: build the report, or print a one-line error and return 2."""
    parser = argparse.ArgumentParser(prog="python -m experiments.report", description=__doc__.split("\n")[0],
                                     allow_abbrev=False)  # a typo of one flag must not silently set another
    parser.add_argument("sweep_dir", type=Path, help="the sweep folder holding runs.csv, e.g. results/default")
    parser.add_argument("--readme", type=Path, default=None, metavar="README.md",
                        help="also write this sweep's headline (wall figure, exponents, crossovers, and accuracy "
                        "when it trained) between the headline markers of this Markdown file")
    parser.add_argument("--headline", default="", metavar="NAME",
                        help="with --readme: write between <!-- headline:NAME:start/end --> instead of the default "
                        "markers (the README keeps a CPU and a GPU headline)")
    parser.add_argument("--claims", default=None, metavar="NAME|PATH",
                        help="also check published claims against this sweep: a file of experiments/report/claims/ "
                        "(e.g. vim_1248) or a TOML path; adds tables/claims.* and a section to summary.md. Without "
                        "it, a rebuild checks the claims the folder's previous report checked")
    parser.add_argument("--no-claims", action="store_true",
                        help="check no claims, even where the previous report did (its tables/claims.* go)")
    args = parser.parse_args(argv)
    if args.claims and args.no_claims:
        parser.error("--claims and --no-claims contradict each other; give one")
    if args.sweep_dir.is_file():  # the runs.csv itself: its folder is the sweep's (summary and tables go there)
        if args.sweep_dir.name != "runs.csv":
            print(f"error: {args.sweep_dir} is a file, not a sweep folder; give the folder that holds runs.csv",
                  file=sys.stderr)
            return 2
        args.sweep_dir = args.sweep_dir.parent
    try:
        if args.readme:  # before the report is rewritten, not after
            check_headline_target(args.readme, args.headline, args.sweep_dir)
        if args.claims:
            load_claims(args.claims)  # likewise: a bad claims file stops before anything is written
        claims = claims_to_check(args.sweep_dir, args.claims, args.no_claims)  # reads a recorded one likewise
        if claims and not args.claims:
            print(f"checking the claims of {claims} again, as the previous report did (--no-claims drops them)")
        # refuses links at runs.csv, tables/, figures/ and summary.md, and a summary.md it did not write
        written = build_report(args.sweep_dir, claims=claims, drop_claims=args.no_claims)
        if args.readme:
            write_headline(args.readme, args.sweep_dir, args.headline)
    except (ReportError, ClaimsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} files; see {args.sweep_dir / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
