//! What passes between the core and a driver: the arguments of a routine,
//! and the rows of its answer, read with typed errors.

use crate::error::{Error, Result};

/// A value passed to a routine.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// Text.
    Text(&'a str),
    /// A whole number.
    Int(i64),
    /// Bytes.
    Bytes(&'a [u8]),
    /// A truth value.
    Flag(bool),
    /// SQL NULL.
    Null,
}

/// A value of a routine's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// A whole number of any width.
    Int(i64),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
    /// A truth value.
    Flag(bool),
}

/// One row of an answer, read with typed errors that name the backend (a
/// schema changed under us is an error, never a panic).
#[derive(Debug, Clone)]
pub struct SqlRow {
    backend: &'static str,
    pub(super) cells: Vec<Cell>,
}

impl SqlRow {
    /// A row of `backend`'s answer.
    pub fn new(backend: &'static str, cells: Vec<Cell>) -> SqlRow {
        SqlRow { backend, cells }
    }

    fn cell(&self, i: usize) -> Result<&Cell> {
        self.cells
            .get(i)
            .ok_or_else(|| Error::backend(self.backend, format!("an answer without column {i}")))
    }

    fn wrong(&self, i: usize, want: &str, got: &Cell) -> Error {
        Error::backend(
            self.backend,
            format!("column {i}: expected {want}, got {got:?}"),
        )
    }

    /// A whole number.
    pub fn int(&self, i: usize) -> Result<i64> {
        match self.cell(i)? {
            Cell::Int(v) => Ok(*v),
            other => Err(self.wrong(i, "a number", other)),
        }
    }

    /// A whole number or NULL.
    pub fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            _ => self.int(i).map(Some),
        }
    }

    /// Text.
    pub fn text(&self, i: usize) -> Result<String> {
        match self.cell(i)? {
            Cell::Text(v) => Ok(v.clone()),
            Cell::Bytes(v) => {
                String::from_utf8(v.clone()).map_err(|e| Error::backend(self.backend, e))
            }
            other => Err(self.wrong(i, "text", other)),
        }
    }

    /// Text, or `None` for NULL or a column the answer does not have (one
    /// an older schema's routine does not return).
    pub fn opt_text(&self, i: usize) -> Result<Option<String>> {
        match self.cells.get(i) {
            None | Some(Cell::Null) => Ok(None),
            Some(_) => self.text(i).map(Some),
        }
    }

    /// Bytes (NULL reads as none).
    pub fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        match self.cell(i)? {
            Cell::Bytes(v) => Ok(v.clone()),
            Cell::Text(v) => Ok(v.clone().into_bytes()),
            Cell::Null => Ok(Vec::new()),
            other => Err(self.wrong(i, "bytes", other)),
        }
    }

    /// Whether column `i` is there and true (a flag, or a number not 0).
    pub fn truthy(&self, i: usize) -> bool {
        matches!(self.cells.get(i), Some(Cell::Flag(true)))
            || matches!(self.cells.get(i), Some(Cell::Int(n)) if *n != 0)
    }

    /// Bytes or NULL.
    pub fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            _ => self.bytes(i).map(Some),
        }
    }

    /// A truth value (a number: not zero).
    pub fn flag(&self, i: usize) -> Result<bool> {
        match self.cell(i)? {
            Cell::Flag(v) => Ok(*v),
            Cell::Int(v) => Ok(*v != 0),
            other => Err(self.wrong(i, "a truth value", other)),
        }
    }

    pub(super) fn count<T: TryFrom<i64>>(&self, i: usize) -> Result<T> {
        T::try_from(self.int(i)?)
            .map_err(|_| Error::backend(self.backend, format!("column {i} out of range")))
    }
}
