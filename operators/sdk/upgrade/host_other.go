//go:build !wasip1

package upgrade

var _ = migrate      // cairn_migrate's body on wasip1
var _ = stateVersion // cairn_state_version's
