from dataclasses import dataclass

from codemode import CallContext, CapabilityPack, Subject

pack = CapabilityPack()
NOTES: dict[str, list[str]] = {}


@dataclass
class AddIn:
    text: str


@dataclass
class Notes:
    notes: list[str]


@pack.capability("notes.add", search_terms=["new note", "remember"])
def add(ctx: CallContext, subject: Subject, args: AddIn) -> Notes:
    """Add a note to your list and return the whole list."""
    NOTES.setdefault(subject.id, []).append(args.text)
    return Notes(NOTES[subject.id])
