package services

import (
	"github.com/stretchr/testify/assert"
)

type assertCollect = assert.CollectT

func assertNoError(c *assert.CollectT, err error) bool { return assert.NoError(c, err) }

func assertElementsMatch(c *assert.CollectT, want, got []string) bool {
	return assert.ElementsMatch(c, want, got)
}
