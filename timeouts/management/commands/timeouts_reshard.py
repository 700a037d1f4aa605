"""`manage.py timeouts_reshard --from default,tasks_b`: after a shard was added to
TIMEOUTS["SHARDS"], move the slots that changed owner (timeouts/storage/resharding.py)."""

from django.core.management.base import BaseCommand, CommandError

from timeouts.storage import resharding, shards


class Command(BaseCommand):
    help = ("Move the tasks of the slots whose shard changed between the SHARDS given with --from and "
            "TIMEOUTS['SHARDS'] now. Stop every dispatcher, beat, worker and scheduler first.")

    def add_arguments(self, parser):
        parser.add_argument("--from", dest="old", required=True,
                            help="The SHARDS before the change, comma-separated, in their order.")
        parser.add_argument("--dry-run", action="store_true", help="Say what would move; move nothing.")

    def handle(self, *args, old, dry_run, **options):
        try:
            resharding.check_router()
        except resharding.ReshardError as exc:
            raise CommandError(str(exc)) from None
        old = [alias.strip() for alias in old.split(",") if alias.strip()]
        new = list(shards.aliases())
        unknown = [alias for alias in old if alias not in new]
        if not old or unknown:
            raise CommandError(f"--from must list shards that are still in TIMEOUTS['SHARDS'] ({', '.join(new)}); "
                               f"got {old!r}")
        planned = resharding.moves(old, new)
        if not planned:
            self.stdout.write("No slot changes shard.")
            return
        try:
            for move in planned:
                resharding.check(move)
        except resharding.ReshardError as exc:
            raise CommandError(str(exc)) from None
        for move in planned:
            if dry_run:
                self.stdout.write(f"would move {move}")
                continue
            self.stdout.write(f"moved {move}: {resharding.apply(move)} task(s)")
        if not dry_run:
            resharding.copy_limits(old[0], [alias for alias in new if alias not in old])
            resharding.raise_sequences(new)
            resharding.clear_limit_shares(new)
