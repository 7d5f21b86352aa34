# Example authorization policy for the records pack (codemode_capabilities.records).
#
# Load it with:
#   codemode serve --stdio --pack codemode_capabilities.records:pack \
#       --rego-policy examples/policy.rego --rego-decision data.codemode.records.allow
#
# The host evaluates the decision once per native call, with the input document
#   {"subject": {"id": ...}, "capability": {"id": ..., "name": ...}, "arguments": {...}}
# (see docs/reference/authorization.md). true allows, false denies ("permission denied");
# anything else is an "authorization policy failure". Rules match on the stable capability
# *id*, which does not change when a capability is renamed for the model.
package codemode.records

import rego.v1

default allow := false

# Who is who. In a real deployment this would come from data, not from the policy text.
admins := {"alice"}

editors := {"carol"}

readers := {"bob"}

read_ids := {"records.entry.get", "records.entry.search"}

edit_ids := {"records.entry.create", "records.entry.update"}

# Admins may call every records capability, delete included.
allow if {
	input.subject.id in admins
	startswith(input.capability.id, "records.entry.")
}

# Editors and readers may read, but a search may ask for at most 20 records.
allow if {
	may_read
	input.capability.id in read_ids
	object.get(input.arguments, "limit", 0) <= 20
}

# Editors may also create and update records; they may never delete.
allow if {
	input.subject.id in editors
	input.capability.id in edit_ids
}

may_read if input.subject.id in editors

may_read if input.subject.id in readers
